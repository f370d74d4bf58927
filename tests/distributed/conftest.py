"""Fixtures of the distributed tests, found by name: ``sft_model`` (a tiny toolworld policy for the
data-parallel trainer tests) and ``sft_moe`` (a tiny Qwen3-MoE for the sharded ones); see
tests/support/rl_fixtures.py."""

from tests.support.rl_fixtures import sft_model, sft_moe

__all__ = ["sft_model", "sft_moe"]
