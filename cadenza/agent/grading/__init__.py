"""Grading an agent's workspace: which changes count (``policy``), what they may do (``capabilities``),
the graded run on a fresh copy (``grade``), and the workspace comparison they share (``diff``)."""
