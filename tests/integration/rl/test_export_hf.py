"""An RL checkpoint exported as an HF folder: transformers' AutoModelForCausalLM loads it with the
trainer's logits, the vLLM engine venv serves it with the trainer's log-probs, and an existing target
is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cadenza.rl.engines import make_engine
from cadenza.rl.train.trainer import Trainer
from tests.support.engine_helpers import TOL, hf_logprobs, requires_vllm
from tests.support.rl_fixtures import config

pytestmark = [pytest.mark.slow, pytest.mark.serial, requires_vllm]

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "generation_config.json",
    "cadenza_export.json",
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cadenza", "export-hf", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_exported_checkpoint_loads_in_transformers_and_vllm(sft_model_32: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(config(sft_model_32, tmp_path / "run", steps=2, lambda_sd=1.0))
        trainer.train()
        trainer.close()
    finally:
        torch.set_num_threads(threads)
    proc = _cli(str(tmp_path / "run"), "--out", str(tmp_path / "hf"))  # a run dir: its final policy
    assert proc.returncode == 0, proc.stderr[-2000:]
    hf = tmp_path / "hf"
    assert all((hf / f).is_file() for f in FILES), sorted(p.name for p in hf.iterdir())
    assert json.loads((hf / "cadenza_export.json").read_text())["step"] == 2
    tok = AutoTokenizer.from_pretrained(str(hf), local_files_only=True)
    messages = [{"role": "user", "content": "count to 3"}]
    seq = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    seq = [*seq, *tok.encode("<tool_call> add", add_special_tokens=False)]
    loaded = AutoModelForCausalLM.from_pretrained(str(hf), local_files_only=True).eval()
    trainer.model.eval()
    with torch.no_grad():
        ours = trainer.model(torch.tensor([seq])).logits
        theirs = loaded(torch.tensor([seq])).logits
        start = AutoModelForCausalLM.from_pretrained(str(sft_model_32), local_files_only=True)(
            torch.tensor([seq])
        ).logits
    assert torch.equal(ours, theirs)
    assert float((ours - start).abs().max()) > 1e-3, "training moved nothing: the test could not fail"

    engine = make_engine("vllm", model=str(hf), max_model_len=1024, request_timeout_s=120, sync_timeout_s=60)
    try:
        got = torch.tensor(engine.score([seq])[0])
    finally:
        engine.close()
    ref = hf_logprobs(trainer.policy, seq)
    assert float((got - ref).abs().max()) <= TOL

    again = _cli(str(tmp_path / "run"), "--out", str(hf))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr
