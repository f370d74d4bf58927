"""Bridges to tools a team already uses: mini-swe-agent on cadenza tasks, SWE-bench's own checks.

Torch-free. mini-swe-agent and swebench live in their own venv (``<venv>/ecosystem``, made by
``python -m cadenza.integrations.install``): mini-swe-agent pins an older ``python-dateutil`` than the
trainer's venv has, and both pull in litellm/datasets/docker clients the trainer never needs.
"""
