"""Hint generators: where a turn could have been better, a short text to put in its context.

``generate_hints(traj, tools, FeedbackConfig(...))`` runs the configured generators (rules in
:mod:`.rules`, ruff style in :mod:`.style`, the optional LLM critic in :mod:`.critic`);
:func:`.placement.hinted_prefix` builds the teacher's context. No torch here.
"""
