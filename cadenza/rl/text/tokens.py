"""Token-level trajectories: one token sequence per episode, with segments, loss mask and turn spans.

Model tokens are stored exactly as sampled (never re-tokenised), so the loss sees what the policy
produced; prompt and observation segments come from incremental chat-template rendering, so the
concatenation equals what the model saw while it generated. JSON round-trips are exact.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_text

SEGMENT_KINDS = ("system", "prompt", "assistant", "observation", "hint")


@dataclass(kw_only=True)
class Segment:
    """Tokens ``[start, end)`` of one kind; ``message_index`` points into ``messages`` (-1: template glue
    only)."""

    kind: str
    start: int
    end: int
    message_index: int = -1


@dataclass(kw_only=True)
class TokenTrajectory:
    """One episode as the policy saw it.

    ``turn_spans[i]`` is the token span ``[start, end)`` of model turn ``i`` (indexed like
    ``TurnMeta.index``);
    ``loss_mask`` is 1 exactly on those tokens; ``behaviour_logprobs`` holds the sampling-time log-prob of
    each model token and 0 elsewhere.
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    segments: list[Segment]
    turn_spans: list[tuple[int, int]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    group_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def turn_tokens(self, turn: int) -> list[int]:
        start, end = self.turn_spans[turn]
        return self.input_ids[start:end]

    def validate(self) -> None:
        """Raise CadenzaError when the trajectory is inconsistent or has nothing to train on."""
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.behaviour_logprobs) != n:
            raise CadenzaError(
                f"token trajectory {self.group_id!r}: input_ids ({n}), loss_mask ({len(self.loss_mask)}) and "
                f"behaviour_logprobs ({len(self.behaviour_logprobs)}) must have equal length; rebuild it "
                "with rollout()"
            )
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.input_ids):
            raise CadenzaError(f"token trajectory {self.group_id!r}: input_ids must be non-negative integers")
        if not any(self.loss_mask) or not self.turn_spans:
            raise CadenzaError(
                f"token trajectory {self.group_id!r} has no model tokens (empty loss mask); drop it from "
                "the batch "
                "or check that the policy generated at least one turn"
            )
        pos = 0
        for seg in self.segments:
            if seg.kind not in SEGMENT_KINDS or seg.start != pos or seg.end < seg.start:
                raise CadenzaError(
                    f"token trajectory {self.group_id!r}: segment {seg} is not contiguous or has an unknown "
                    "kind; "
                    f"kinds are {SEGMENT_KINDS}"
                )
            pos = seg.end
        if pos != n:
            raise CadenzaError(f"token trajectory {self.group_id!r}: segments cover {pos} of {n} tokens")
        expected = [0] * n
        for start, end in self.turn_spans:
            if not 0 < start < end <= n:
                raise CadenzaError(
                    f"token trajectory {self.group_id!r}: turn span {(start, end)} is out of range"
                )
            expected[start:end] = [1] * (end - start)
        if expected != list(self.loss_mask):
            raise CadenzaError(f"token trajectory {self.group_id!r}: loss_mask differs from the turn spans")
        if not all(math.isfinite(x) for x in self.behaviour_logprobs):
            raise CadenzaError(f"token trajectory {self.group_id!r}: behaviour_logprobs must be finite")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["turn_spans"] = [list(s) for s in self.turn_spans]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenTrajectory:
        data = dict(data)
        data["segments"] = [Segment(**s) for s in data.get("segments", [])]
        data["turn_spans"] = [(int(a), int(b)) for a, b in data.get("turn_spans", [])]
        try:
            return cls(**data)
        except TypeError as exc:
            raise CadenzaError(
                f"not a token trajectory record ({exc}); expected the output of to_dict()"
            ) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> TokenTrajectory:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TokenTrajectory:
        return cls.from_json(Path(path).read_text())


class TokenTrajectoryBuilder:
    """Appends segments in order and keeps mask, spans and log-probs aligned."""

    def __init__(self) -> None:
        self.input_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.behaviour_logprobs: list[float] = []
        self.segments: list[Segment] = []
        self.turn_spans: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.input_ids)

    def add(
        self, kind: str, ids: list[int], message_index: int = -1, logprobs: list[float] | None = None
    ) -> Segment:
        if kind not in SEGMENT_KINDS:
            raise CadenzaError(f"unknown segment kind {kind!r}; use one of {SEGMENT_KINDS}")
        is_model = kind == "assistant"
        if is_model and (logprobs is None or len(logprobs) != len(ids)):
            raise CadenzaError("an assistant segment needs one behaviour log-prob per sampled token")
        start = len(self.input_ids)
        self.input_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1 if is_model else 0] * len(ids))
        self.behaviour_logprobs.extend([float(x) for x in logprobs] if is_model else [0.0] * len(ids))
        seg = Segment(kind=kind, start=start, end=len(self.input_ids), message_index=message_index)
        if ids:
            self.segments.append(seg)
            if is_model:
                self.turn_spans.append((seg.start, seg.end))
        return seg

    def build(self, **kwargs: Any) -> TokenTrajectory:
        return TokenTrajectory(
            input_ids=list(self.input_ids),
            loss_mask=list(self.loss_mask),
            behaviour_logprobs=list(self.behaviour_logprobs),
            segments=list(self.segments),
            turn_spans=list(self.turn_spans),
            **kwargs,
        )


@dataclass(kw_only=True)
class TokenBatch:
    """Right-padded tensors for a list of trajectories (``[B, T]`` each)."""

    input_ids: Any
    attention_mask: Any
    loss_mask: Any
    behaviour_logprobs: Any
    rewards: Any
    group_ids: list[str]
    lengths: list[int]


def collate(trajectories: list[TokenTrajectory], pad_token_id: int, device: Any = "cpu") -> TokenBatch:
    """Validate and right-pad trajectories; raises CadenzaError before any compute on bad input."""
    import torch

    if not trajectories:
        raise CadenzaError("empty batch: no token trajectories to train on")
    if pad_token_id is None:
        raise CadenzaError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")
    for t in trajectories:
        t.validate()
    lengths = [len(t) for t in trajectories]
    B, T = len(trajectories), max(lengths)
    ids = torch.full((B, T), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    blp = torch.zeros((B, T), dtype=torch.float32)
    for b, t in enumerate(trajectories):
        n = len(t)
        ids[b, :n] = torch.tensor(t.input_ids, dtype=torch.long)
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        blp[b, :n] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    return TokenBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        loss_mask=mask.to(device),
        behaviour_logprobs=blp.to(device),
        rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32, device=device),
        group_ids=[t.group_id for t in trajectories],
        lengths=lengths,
    )
