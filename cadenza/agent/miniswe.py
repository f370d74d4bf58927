"""Export a trajectory in mini-swe-agent's trajectory format (``trajectory_format: mini-swe-agent-1.1``).

mini-swe-agent keeps OpenAI chat messages with an ``extra`` dict per message and run-level ``info``
(exit status, submission). Tool calls stay as ``tool_calls`` (its tool-call models do the same); our
per-turn metadata goes into the assistant message's ``extra``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cadenza.agent.trajectory import Trajectory

FORMAT = "mini-swe-agent-1.1"
_EXIT_STATUS = {
    "submit": "Submitted",
    "max_turns": "LimitsExceeded",
    "time_budget": "LimitsExceeded",
    "token_budget": "LimitsExceeded",
}


def to_mini_swe_agent(traj: Trajectory) -> dict[str, Any]:
    by_message = {t.message_index: t for t in traj.turns}
    messages = []
    for i, msg in enumerate(traj.messages):
        out = dict(msg)
        extra: dict[str, Any] = {}
        turn = by_message.get(i)
        if turn is not None:
            extra = {
                k: v
                for k, v in asdict(turn).items()
                if v not in (None, [], {}) and k not in ("token_ids", "logprobs")
            }
        out["extra"] = extra
        messages.append(out)
    outcome = traj.outcome or {}
    end = outcome.get("end_reason")
    return {
        "info": {
            "exit_status": _EXIT_STATUS.get(end, end or "NotFinished"),
            "submission": traj.meta.get("submission", ""),
            "model_stats": {"instance_cost": 0.0, "api_calls": len(traj.turns)},
            "config": {"environment_type": "cadenza.sandbox" if traj.sandboxed else "local (no sandbox)"},
            "instance_id": traj.task_id,
            "resolved": outcome.get("resolved"),
            "reward": traj.reward,
            "flags": [asdict(f) for f in traj.flags],
        },
        "messages": messages,
        "trajectory_format": FORMAT,
    }
