"""An RL checkpoint as a complete Hugging Face folder that transformers and vLLM load as they are.

A checkpoint (``OUT/checkpoints/step-N``) holds the policy's weights under HF names, but not the model
config, tokenizer, chat template or generation config; those follow from the run's ``OUT/config.json``.
:func:`export_hf` rebuilds the trainer's model exactly as the trainer did (:func:`build_policy`), loads
the checkpoint's ``model.safetensors`` into it and writes ``config.json``, ``model.safetensors``, the
tokenizer files with the chat template, ``generation_config.json`` (the run's sampling settings) and
``cadenza_export.json`` (which checkpoint it came from). The folder is staged and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cadenza import checkpoint as lifecycle
from cadenza.config_io import from_dict
from cadenza.errors import CadenzaError
from cadenza.jsonio import atomic_write_json
from cadenza.rl.config import TrainConfig

WEIGHTS = "model.safetensors"


def resolve_checkpoint(path: str | Path) -> Path:
    """A ``step-N`` directory, or a run directory (its newest checkpoint: the final policy)."""
    path = Path(path)
    if lifecycle.read_meta(path) is None and (newest := lifecycle.latest(path / "checkpoints")) is not None:
        return newest
    lifecycle.require_meta(path)
    if not (path / WEIGHTS).is_file():
        raise CadenzaError(f"{path} holds no {WEIGHTS}; export a checkpoint written by cadenza train")
    return path


def run_config(ckpt: Path) -> TrainConfig:
    """The config of the run that wrote ``ckpt`` (``<run>/config.json`` beside ``checkpoints/``)."""
    path = ckpt.parent.parent / "config.json"
    if not path.is_file():
        raise CadenzaError(f"{path} does not exist; the checkpoint must sit in its run's checkpoints/ folder")
    return from_dict(TrainConfig, json.loads(path.read_text()))


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write ``out`` (which must not exist) as an HF folder of ``checkpoint``; return it."""
    out = Path(out)
    if out.exists():
        raise CadenzaError(f"{out} already exists; pass a new --out directory (or remove it first)")
    ckpt = resolve_checkpoint(checkpoint)
    cfg = run_config(ckpt)
    from safetensors.torch import load_model
    from transformers import GenerationConfig

    from cadenza.rl.train.build import build_policy

    tokenizer, policy = build_policy(cfg)
    load_model(policy.model, str(ckpt / WEIGHTS))
    stage = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(stage, ignore_errors=True)
    policy.model.save_pretrained(str(stage))
    tokenizer.save_pretrained(str(stage))
    r = cfg.rollout
    GenerationConfig(
        do_sample=True, temperature=r.temperature, top_k=r.top_k or None, max_new_tokens=r.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    ).save_pretrained(str(stage))  # fmt: skip
    step = lifecycle.read_meta(ckpt)["step"]  # type: ignore[index]
    atomic_write_json(stage / "cadenza_export.json", {"checkpoint": str(ckpt.resolve()), "step": step})
    stage.rename(out)
    return out
