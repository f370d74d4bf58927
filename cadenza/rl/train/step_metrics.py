"""One training step's metrics about its episodes and its update (the trainer adds the timings)."""

from __future__ import annotations

from typing import Any

from cadenza.rl.rollout.episodes import TrainEpisode
from cadenza.rl.train.update import UpdateResult


def metrics_row(
    episodes: list[TrainEpisode], upd: UpdateResult, kl: float, pool_row: dict[str, Any]
) -> dict[str, Any]:
    """The step's metrics about its episodes and its update (timings are added by the caller)."""
    tokens = [e.rollout.tokens for e in episodes]
    turns = [t for e in episodes for t in e.trajectory.turns]
    n_turns, n_eps = max(1, len(turns)), max(1, len(episodes))
    return {
        "reward": sum(t.reward for t in tokens) / n_eps,
        "resolved_rate": sum(bool(e.rollout.outcome.get("resolved")) for e in episodes) / n_eps,
        "invalid_tool_rate": sum(t.error_kind == "tool_not_found" for t in turns) / n_turns,
        "valid_call_rate": sum(t.tool is not None and t.error_kind != "tool_not_found" for t in turns)
        / n_turns,
        "tool_error_rate": sum(t.error_kind is not None for t in turns) / n_turns,
        "turns_per_episode": len(turns) / n_eps,
        "hinted_turns": len(upd.hinted),
        "hint_rate": len(upd.hinted) / n_turns,
        "flagged": sum(e.flags > 0 for e in episodes),
        "grpo_loss": upd.grpo_loss,
        "sd_loss": upd.sd_loss,
        "sd_tokens": upd.sd_tokens,
        "kl_unhinted": kl,
        "entropy_unhinted": upd.entropy_unhinted,
        "clip_fraction": upd.clip_fraction,
        "mismatch_kl": upd.mismatch_kl,
        "is_truncated": upd.is_truncated,
        "grad_norm": upd.grad_norm,
        "skipped_update": upd.skipped,
        "model_tokens": sum(t.num_model_tokens for t in tokens),
        "zero_variance_groups": upd.zero_variance_groups,
        **pool_row,
    }
