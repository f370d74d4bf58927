"""Shared pieces of the real-vLLM engine tests: reference log-probs from HF, a training-like update,
and the parity check run after every weight sync."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from cadenza.rl.engines.policy import HFPolicy
from cadenza.rl.engines.vllm_server import vllm_installed

TOL = 1e-4  # fp32 parity between engine and trainer log-probs

requires_vllm = pytest.mark.skipif(
    not vllm_installed(), reason="vLLM not installed (python -m cadenza.rl.engines.install)"
)


def save(policy: HFPolicy, tok: Any, path: Path) -> Path:
    policy.model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@torch.no_grad()
def hf_logprobs(policy: HFPolicy, seq: list[int], *, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of tokens 1..T-1 under the trainer's model (the independent reference)."""
    logits = policy.model(torch.tensor([seq])).logits[0, :-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]


def train_step(policy: HFPolicy, seqs: list[list[int]], *, lr: float) -> None:
    """One real optimizer step (SGD on the sequences' NLL): every weight the loss touches moves."""
    model = policy.model
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros(())
    for s in seqs:  # mean token NLL: a step of the size training takes, not one that saturates the logits
        logits = model(torch.tensor([s])).logits[0, :-1].float()
        total = total - logits.log_softmax(-1).gather(-1, torch.tensor(s[1:])[:, None]).mean() / len(seqs)
    opt.zero_grad()
    total.backward()
    opt.step()
    model.eval()


def check_sync_parity(
    engine: Any, policy: HFPolicy, seqs: list[list[int]], *, steps: int, lr: float, first_version: int = 1
) -> None:
    """After each step the engine scores like the updated trainer (<= TOL) and, before the sync, not."""
    for step in range(first_version, first_version + steps):
        train_step(policy, seqs, lr=lr)
        before = [torch.tensor(x) for x in engine.score(seqs)]
        new = [hf_logprobs(policy, s) for s in seqs]
        gap = max(float((b - n).abs().max()) for b, n in zip(before, new, strict=True))
        assert gap > 10 * TOL, f"step {step}: engine already matched before the sync (gap {gap:.2e})"
        engine.sync_weights(policy.model.named_parameters(), version=step)
        assert engine.version == step
        after = [torch.tensor(x) for x in engine.score(seqs)]
        err = max(float((a - n).abs().max()) for a, n in zip(after, new, strict=True))
        assert err <= TOL, f"step {step}: engine log-probs differ from the trainer's by {err:.2e}"


def engine_processes(port: int) -> list[str]:
    """vLLM processes serving ``port`` (other tests may run engines of their own meanwhile)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if "vllm.entrypoints" in line and f"--port {port}" in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
