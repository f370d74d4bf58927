"""Fixtures of the integration tests, found by name (no imports in the test modules).

``task_env``: a real venv with pytest, built once per session by copying pytest's files (fast, no pip);
``taskset`` / ``task_dir`` / ``chained_task_dir``: the built-in toy task in a task set using it;
``sft_model`` / ``sft_model_32``: tiny toolworld policies for the trainer tests (see
tests/support/rl_fixtures.py).
"""

from tests.support.monitor_fixtures import task_env
from tests.support.rl_fixtures import sft_model, sft_model_32
from tests.support.sandbox_fixtures import chained_task_dir, task_dir, taskset

__all__ = ["chained_task_dir", "sft_model", "sft_model_32", "task_dir", "task_env", "taskset"]
