"""Teacher inputs for per-turn self-distillation: the hinted prefix followed by the target turn's own tokens.

For a hint on turn ``k`` the teacher reads the trajectory's messages before that turn with the hint
inserted (placement per :mod:`cadenza.feedback.placement`), rendered by the chat template with the
generation prompt, then exactly the tokens the policy sampled for turn ``k``. Only those target
tokens enter the loss; the teacher pass stops at the end of the target turn and runs under no_grad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.feedback.placement import hinted_prefix
from cadenza.rl.chat import render


@dataclass(kw_only=True)
class TeacherInput:
    episode: int  # index into the step's episodes
    turn: int
    start: int  # target span [start, end) in the student's token sequence
    end: int
    input_ids: list[int]  # hinted prefix + target tokens
    target_ids: list[int]

    @property
    def prefix_len(self) -> int:
        return len(self.input_ids) - len(self.target_ids)


def build_teacher_inputs(tokenizer: Any, episodes: list[Any], placement: str) -> list[TeacherInput]:
    """One input per hinted turn (several hints on one turn are joined into one context)."""
    out = []
    for e, ep in enumerate(episodes):
        by_turn: dict[int, list] = {}
        for h in ep.hints:
            by_turn.setdefault(h.turn, []).append(h)
        traj, toks = ep.rollout.trajectory, ep.rollout.tokens
        for turn, hints in sorted(by_turn.items()):
            if not 0 <= turn < len(traj.turns) or turn >= len(toks.turn_spans):
                raise CadenzaError(f"hint points at turn {turn}, but the trajectory has {len(traj.turns)} turns")
            msgs = hinted_prefix(traj.messages, traj.turns[turn].message_index, hints, placement)
            prefix = tokenizer.encode(render(tokenizer, msgs, ep.render_tools or None, add_generation_prompt=True), add_special_tokens=False)
            start, end = toks.turn_spans[turn]
            target = toks.input_ids[start:end]
            out.append(TeacherInput(episode=e, turn=turn, start=start, end=end, input_ids=prefix + target, target_ids=target))
    return out


@torch.no_grad()
def teacher_hidden(model: torch.nn.Module, inputs: list[TeacherInput], pad_id: int) -> torch.Tensor:
    """Teacher hidden states at the positions that predict each target token, concatenated: ``[N, D]``."""
    width = max(len(x.input_ids) for x in inputs)
    ids = torch.full((len(inputs), width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((len(inputs), width), dtype=torch.long)
    for r, x in enumerate(inputs):
        ids[r, : len(x.input_ids)] = torch.tensor(x.input_ids)
        attn[r, : len(x.input_ids)] = 1
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    return torch.cat([hidden[r, x.prefix_len - 1 : len(x.input_ids) - 1] for r, x in enumerate(inputs)])
