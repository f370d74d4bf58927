"""Hint generators: where a turn could have been better, a short text to put in its context."""
