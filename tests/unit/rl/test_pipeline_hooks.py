"""The trainer's curriculum hooks without a model: which rows keep their GRPO term, what ``record``
receives."""

from __future__ import annotations

from types import SimpleNamespace

from cadenza.rl.rollout.episodes import record_pool, signal_rows
from cadenza.rl.rollout.taskset import GroupOutcome


def _tokens(groups: dict[str, list[float]]) -> list[SimpleNamespace]:
    return [SimpleNamespace(group_id=g, reward=r) for g, rs in groups.items() for r in rs]


def test_zero_variance_groups_leave_the_grpo_term_unless_disabled() -> None:
    toks = _tokens({"0:a": [1.0, 1.0], "1:b": [0.0, 1.0, 0.0], "2:c": [0.0, 0.0], "3:d": [0.5]})
    rows, dropped = signal_rows(toks, True)
    assert rows == {2, 3, 4} and dropped == 3  # only b varies; a single-sample group carries no signal either
    rows, dropped = signal_rows(toks, False)
    assert rows == set(range(len(toks))) and dropped == 3


def test_record_gets_one_outcome_per_rollout_with_the_task_id() -> None:
    got = []

    def record(step, outcomes):
        got.append((step, outcomes))
        return {"pool_active": 7}

    def episode(gid: str, reward: float, resolved: bool, flags: int) -> SimpleNamespace:
        return SimpleNamespace(
            rollout=SimpleNamespace(
                tokens=SimpleNamespace(group_id=gid, reward=reward), outcome={"resolved": resolved}
            ),
            trajectory=SimpleNamespace(flags=[]),
            flags=flags,
        )

    source = SimpleNamespace(record=record)
    eps = [episode("0:pkg__f:L1", 1.0, True, 0), episode("0:pkg__f:L1", 0.0, True, 2)]
    assert record_pool(source, 5, eps) == {"pool_active": 7}
    assert got == [
        (
            5,
            [
                GroupOutcome(task_id="pkg__f:L1", reward=1.0, resolved=True, flagged=False),
                GroupOutcome(task_id="pkg__f:L1", reward=0.0, resolved=True, flagged=True),
            ],
        )
    ]
    assert record_pool(object(), 1, eps) == {}
