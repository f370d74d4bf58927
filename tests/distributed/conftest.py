"""Fixtures of the distributed tests, found by name: ``sft_model`` (a tiny toolworld policy for the
data-parallel trainer tests; see tests/support/rl_fixtures.py)."""

from tests.support.rl_fixtures import sft_model

__all__ = ["sft_model"]
