"""Bubblewrap execution with rlimits, wall-clock timeouts and output capping."""
