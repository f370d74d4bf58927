"""Trainer configuration: ``@dataclass(kw_only=True)`` sections loaded from TOML with strict checks.

Every mistake (unknown key, wrong type, impossible value, missing model path) is a one-line
:class:`ConfigError` naming the key and the fix, raised by :func:`load_config` before any compute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cadenza.config_io import apply_overrides, from_dict, read_toml
from cadenza.errors import CadenzaError, ConfigError, need
from cadenza.feedback.generate import FeedbackConfig
from cadenza.parallel.dims import ParallelDims


@dataclass(kw_only=True)
class RunConfig:
    out_dir: str = "runs/train"  # metrics.jsonl, config.json and checkpoints/ go here
    steps: int = 10  # optimizer steps (each: rollouts, grading, feedback, one update)
    seed: int = 0  # task and token sampling of step s are seeded from (seed, s): exact resume
    checkpoint_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept
    tensorboard: bool = False  # only used if the tensorboard package is installed
    wandb: bool = False  # also log to Weights & Biases (pip install 'cadenza[wandb]'; WANDB_MODE=offline)
    wandb_project: str = "cadenza"  # the wandb project of the run (the run is named after out_dir)
    progress: bool = True  # a progress bar with reward, invalid-tool rate and SD loss
    threads: int = 0  # torch intra-op threads (0 = torch's default); 1 suits tiny models on shared CPUs
    measure_kl: bool = True  # KL(before || after) of each update on un-hinted turns (one extra forward)
    # torchrun: the longest one collective waits for the other ranks (a dead or hung rank ends the run
    # after at most this long); it must exceed one step's rollouts, which the other ranks wait out
    collective_timeout_s: float = 1800.0


@dataclass(kw_only=True)
class ModelConfig:
    """``path``: an HF causal-LM directory. Empty ``path`` = random init from ``arch`` (tests, toy runs),
    which needs ``tokenizer`` (a directory saved with ``save_pretrained``, with a chat template)."""

    path: str = (
        ""  # an HF causal-LM directory, or "smollm2" (offline SmolLM2-135M-Instruct); empty = random init
    )
    tokenizer: str = ""  # tokenizer directory with a chat template; defaults to path
    arch: Literal["qwen3", "qwen3_moe"] = "qwen3"  # random init only, as are the sizes below
    hidden_size: int = 64  # model width
    num_layers: int = 2  # decoder layers
    num_heads: int = 4  # attention heads (divide hidden_size)
    num_kv_heads: int = 2  # key/value heads (divide num_heads)
    intermediate_size: int = 128  # MLP (or expert) hidden size
    num_experts: int = 8  # qwen3_moe: routed experts
    experts_per_token: int = 2  # qwen3_moe: experts each token is routed to
    dtype: Literal["float32", "bfloat16"] = "float32"  # parameter dtype of the policy
    device: str = "cpu"  # e.g. "cuda" for real runs
    trainable_layers: int = 0  # 0 = all train; N = only the last N decoder layers and the final norm


@dataclass(kw_only=True)
class EnvConfig:
    """``name``: a registered environment (``toolworld``, ``taskset``) or ``package.module:factory``."""

    name: str = "toolworld"  # toolworld | taskset | package.module:factory
    options: dict[str, Any] = field(default_factory=dict)  # passed to the environment factory


@dataclass(kw_only=True)
class RolloutParams:
    """How episodes are sampled: what :func:`cadenza.rl.rollout.loop.rollout` takes (``[rollout]`` is one)."""

    group_size: int = 8  # G samples per task
    max_new_tokens: int = 64  # tokens per model turn
    temperature: float = 1.0  # sampling temperature of the rollouts
    top_k: int = 0  # 0 = off; sampling only (eval, probes): training rejects > 0 (it biases the ratios)
    max_turns: int = 8  # model turns (tool calls) per episode
    max_context_tokens: int = 4096  # prompt + episode tokens; an episode that reaches it ends (graded as is)
    # text every assistant turn starts with, as prompt tokens (a forced tool call, as tool_choice="required"
    # does by prefilling), e.g. '<tool_call>'; prepended to the sampled text before tool calls are parsed
    response_prefix: str = ""
    # a turn without a tool call: end = the final answer, the episode ends (graded); nudge = the env
    # answers it (a reminder to call a tool) and the episode goes on (cadenza.agent.loop, docs/async.md)
    no_tool_call: Literal["end", "nudge"] = "end"
    # per_episode: every episode on its own clock, the turns waiting at once batched together;
    # lockstep: every turn waits for the slowest episode, tools one after another (for comparison)
    schedule: Literal["per_episode", "lockstep"] = "per_episode"
    tool_workers: int = 8  # tool calls (and gradings) of different episodes running at once
    inflight_batches: int = 0  # generation batches in flight at once, served engines (0 = 8; hf: always 1)

    def __post_init__(self) -> None:
        for name in ("group_size", "max_turns", "max_new_tokens", "max_context_tokens", "tool_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.no_tool_call not in ("end", "nudge"):
            raise ConfigError(f"rollout.no_tool_call = {self.no_tool_call!r}; use 'end' or 'nudge'")
        if self.schedule not in ("per_episode", "lockstep"):
            raise ConfigError(f"rollout.schedule = {self.schedule!r}; use 'per_episode' or 'lockstep'")
        if self.inflight_batches < 0:
            raise ConfigError(
                f"rollout.inflight_batches must be >= 0 (0 = auto), got {self.inflight_batches}"
            )


@dataclass(kw_only=True)
class RolloutConfig(RolloutParams):
    """``[rollout]``: how episodes are sampled (the fields of ``RolloutParams``, which
    :func:`cadenza.rl.rollout.loop.rollout` takes as they are), who samples them and where they run."""

    tasks_per_step: int = 4  # GRPO groups per step
    engine: Literal["hf", "vllm", "openai"] = (
        "hf"  # who samples: in-process HF, a vLLM server, any OpenAI API
    )
    engines: int = 1  # engine = "vllm": servers the trainer starts and syncs (several: behind a router)
    engine_timeout_s: float = 600.0  # longest one engine call (a generation or a weight sync) may take
    engine_options: dict[str, Any] = field(default_factory=dict)  # engine-specific knobs (see docs/async.md)
    max_staleness: int = 0  # K: rollouts of step n+1..n+K are sampled while step n trains (0 = synchronous)
    sync_probe_tol: float = 0.0  # vllm: stop when engine and trainer disagree by more after a sync (0 = off)
    executor: Literal["local", "ray"] = (
        "local"  # where episodes run: this process, or Ray actors (docs/ray.md)
    )
    workers: int = 2  # executor = "ray": rollout actors (one CPU each), each owning its envs and sandboxes
    ray_address: str = ""  # executor = "ray": "" = a private loopback cluster, else host:port or "auto"
    # max_staleness >= 1: a weight sync does not wait for the queued rollouts; it waits for the batch in
    # flight, loads the new weights, and the episodes in progress go on with them (every turn records
    # the version that sampled it; the staleness bound reads the oldest). Faster, but the trajectories
    # then depend on timing (docs/async.md)
    partial_rollouts: bool = False
    # executor = "ray": longest one unit (a task's G episodes: generation, tools, grading) may run on its
    # actor; past it the actor is killed and the unit re-run (up to the executor's retries), then the
    # run stops with one line
    unit_timeout_s: float = 1800.0


@dataclass(kw_only=True)
class LossConfig:
    """``L = L_grpo + lambda_sd * L_sd``; SD is gated per turn to the hinted turns only."""

    lambda_sd: float = 1.0  # weight of the self-distillation term (0 = GRPO only)
    divergence: Literal["reverse_kl", "forward_kl", "jsd"] = "reverse_kl"  # student-teacher divergence of SD
    beta: float = 0.5  # jsd weight: 0 = forward KL, 1 = reverse KL
    top_k: int = 0  # 0 = full vocabulary; k = teacher's top-k tokens plus one tail bucket
    sd_temperature: float = 1.0  # temperature of both distributions in the SD divergence
    token_clip: float = 0.0  # cap on each token's divergence (0 = off)
    clip_eps: float = 0.2  # PPO/GRPO ratio clip, lower side
    clip_eps_high: float = 0.28  # upper side (clip-higher)
    aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"  # how GRPO averages over tokens
    std_normalize: bool = True  # GRPO advantages divided by the group std (False = Dr. GRPO)
    kl_ref: float = 0.0  # coefficient of the k3 KL to the frozen initial policy (0 = off)
    drop_zero_variance: bool = (
        True  # groups whose rewards are all equal leave the GRPO term (counted, logged)
    )
    # subtracted from the advantage of every token of a turn a feedback rule flags (the turns SD would
    # target), whatever lambda_sd: turn-level credit without words (a control); 0 = off
    turn_penalty: float = 0.0
    is_cap: float = 2.0  # truncated importance-sampling cap on trainer/engine ratios (0 = off; docs/async.md)
    # per-token SD estimate: full = the divergence over the vocabulary; sampled = log p_s - log p_t on the
    # turn's own tokens (cheaper, noisier)
    sd_estimator: Literal["full", "sampled"] = "full"


@dataclass(kw_only=True)
class TeacherConfig:
    """The self-distillation teacher; see docs/experiments.md ("Which teacher") for the evidence."""

    # frozen: the initial policy (default); ema: moving average; snapshot: copy refreshed every
    # refresh_every steps (a target network); live: the policy itself -- it erodes, use with care
    weights: Literal["frozen", "ema", "snapshot", "live"] = "frozen"
    ema_decay: float = 0.99  # per optimizer step: the teacher averages over ~1 / (1 - decay) steps
    refresh_every: int = 10  # snapshot teacher: steps between refreshes
    chunk_size: int = 1024  # tokens per logits chunk
    reuse_prefix_cache: bool = True  # live teacher: reuse the student's KV cache for the shared prefix


@dataclass(kw_only=True)
class ProbeConfig:
    """The hint-following diagnostic (cadenza.rl.learn.probe): teacher's and student's P(correct action)
    with and without the hint on a fixed held-out probe set, logged as ``probe_*`` in metrics.jsonl."""

    every: int = 5  # measure every N steps (0 = off); off as well when the env offers no probe and no path
    items: int = 32  # probe items (from the env source, or the first N of ``path``)
    path: str = ""  # JSONL of {messages, hint, target[, tools]}; empty = the env source's probe_items
    seed: int = 0  # seed of the env source's held-out probe set
    stop_ratio: float = 0.0  # stop once teacher P(correct | hint) < ratio x its first value (0 = never)


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out evaluation during training (cadenza.rl.train.heldout), logged as ``eval/*`` in every
    metrics sink and drawn to ``OUT/eval.png``."""

    every: int = 0  # evaluate every N steps and after the last (0 = off)
    tasks: str = ""  # a task set directory to evaluate on; empty = the env's held-out split
    num_tasks: int = 16  # held-out tasks (the first N of the split or the task set)
    episodes_per_task: int = 1  # episodes on each task
    greedy: bool = True  # greedy decoding; false = sampled at rollout.temperature
    seed: int = 0  # seed of the held-out split and of sampled evaluation


@dataclass(kw_only=True)
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"
    lr: float = 1e-3  # AdamW (and, with muon, the AdamW-handled embeddings/head/norms)
    muon_lr: float = 0.02  # learning rate of Muon's matrix groups
    muon_ns_dtype: Literal["bfloat16", "float32"] = (
        "bfloat16"  # Newton–Schulz precision (float32: exact parity)
    )
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas (optim.name = "adamw")
    weight_decay: float = 0.0  # decoupled weight decay on every parameter
    grad_clip: float = 1.0  # 0 = off
    microbatch: int = 8  # trajectories per forward/backward


@dataclass(kw_only=True)
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    parallel: ParallelDims = field(default_factory=ParallelDims)  # the dual mesh under torchrun (as pretrain)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def validate(cfg: TrainConfig, base: Path = Path(".")) -> None:
    """Value checks that need no compute: ranges, cross-field rules, paths that must exist."""
    need(cfg.run.steps >= 1, "run.steps must be >= 1")
    need(cfg.run.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = only at the end)")
    need(cfg.run.threads >= 0, "run.threads must be >= 0 (0 = torch's default)")
    need(cfg.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1")
    need(cfg.run.collective_timeout_s > 0, "run.collective_timeout_s must be > 0 (seconds)")
    if cfg.run.wandb:
        from cadenza.metrics import require_wandb

        require_wandb()
    need(cfg.rollout.group_size >= 2, "rollout.group_size must be >= 2 (GRPO normalises within a group)")
    need(cfg.rollout.tasks_per_step >= 1, "rollout.tasks_per_step must be >= 1")
    need(
        cfg.rollout.max_new_tokens >= 1 and cfg.rollout.max_turns >= 1,
        "rollout.max_new_tokens and max_turns must be >= 1",
    )
    need(cfg.rollout.temperature > 0, "rollout.temperature must be > 0")
    need(
        cfg.rollout.top_k == 0,
        f"rollout.top_k = {cfg.rollout.top_k}: training needs 0, because the trainer's log-probs are over "
        "the full vocabulary and a top-k sampler biases every importance ratio (use temperature instead)",
    )
    validate_engine(cfg.rollout)
    need(cfg.loss.lambda_sd >= 0, "loss.lambda_sd must be >= 0")
    need(cfg.loss.turn_penalty >= 0, "loss.turn_penalty must be >= 0 (0 = off)")
    need(0 <= cfg.loss.beta <= 1, "loss.beta must be in [0, 1]")
    need(cfg.loss.top_k >= 0, "loss.top_k must be >= 0 (0 = full vocabulary)")
    need(cfg.loss.sd_temperature > 0, "loss.sd_temperature must be > 0")
    need(
        cfg.loss.clip_eps > 0 and cfg.loss.clip_eps_high > 0,
        "loss.clip_eps and loss.clip_eps_high must be > 0",
    )
    need(cfg.loss.token_clip >= 0, "loss.token_clip must be >= 0 (0 = off)")
    need(cfg.loss.kl_ref >= 0, "loss.kl_ref must be >= 0")
    need(
        cfg.loss.is_cap == 0 or cfg.loss.is_cap >= 1,
        f"loss.is_cap must be 0 (off) or >= 1 (a cap on importance weights), got {cfg.loss.is_cap}",
    )
    need(0 < cfg.teacher.ema_decay < 1, "teacher.ema_decay must be in (0, 1)")
    need(cfg.teacher.chunk_size >= 1, "teacher.chunk_size must be >= 1")
    need(cfg.teacher.refresh_every >= 1, "teacher.refresh_every must be >= 1")
    need(cfg.probe.every >= 0, "probe.every must be >= 0 (0 = off)")
    need(cfg.probe.items >= 1, "probe.items must be >= 1")
    need(cfg.eval.every >= 0, "eval.every must be >= 0 (0 = off)")
    need(
        cfg.eval.num_tasks >= 1 and cfg.eval.episodes_per_task >= 1,
        "eval.num_tasks and eval.episodes_per_task must be >= 1",
    )
    if cfg.eval.tasks:
        cfg.eval.tasks = str(_resolve(cfg.eval.tasks, base))
        need(
            Path(cfg.eval.tasks).is_dir(),
            f"eval.tasks {cfg.eval.tasks!r} is not a directory; pass a task set",
        )
    need(0 <= cfg.probe.stop_ratio < 1, "probe.stop_ratio must be in [0, 1) (0 = never stop)")
    need(cfg.optim.lr > 0, "optim.lr must be > 0")
    need(
        len(cfg.optim.betas) == 2 and all(0 <= b < 1 for b in cfg.optim.betas),
        "optim.betas must be two numbers in [0, 1)",
    )
    need(cfg.optim.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 = off)")
    need(cfg.optim.microbatch >= 1, "optim.microbatch must be >= 1")
    cfg.feedback.validate()
    m = cfg.model
    if m.path:
        from cadenza.rl.models import resolve_model

        m.path = resolve_model(m.path)  # "smollm2": the offline pretrained model (docs/engines.md)
        p = _resolve(m.path, base)
        need(
            p.is_dir(),
            f"model.path {str(p)!r} does not exist or is not a directory; point it at an HF model directory",
        )
        m.path = str(p)
    else:
        need(
            bool(m.tokenizer),
            "model.path is empty and model.tokenizer is not set; random init needs a tokenizer directory",
        )
    if m.tokenizer:
        t = _resolve(m.tokenizer, base)
        need(
            t.is_dir(),
            f"model.tokenizer {str(t)!r} does not exist; point it at a tokenizer saved with save_pretrained",
        )
        m.tokenizer = str(t)
    need(m.hidden_size % m.num_heads == 0, "model.hidden_size must be divisible by model.num_heads")
    need(m.num_heads % m.num_kv_heads == 0, "model.num_heads must be divisible by model.num_kv_heads")
    need(m.experts_per_token <= m.num_experts, "model.experts_per_token must be <= model.num_experts")
    need(m.trainable_layers >= 0, "model.trainable_layers must be >= 0 (0 = every layer trains)")


def validate_engine(r: RolloutConfig) -> None:
    """The engine and staleness settings (also checked by ``cadenza demo`` before it builds tasks)."""
    if r.engine not in ("hf", "vllm", "openai"):
        raise ConfigError(f"rollout.engine = {r.engine!r} is not allowed; use 'hf', 'vllm' or 'openai'")
    if r.max_staleness < 0:
        raise ConfigError(f"rollout.max_staleness must be >= 0 (0 = synchronous), got {r.max_staleness}")
    if not r.engine_timeout_s > 0:
        raise ConfigError("rollout.engine_timeout_s must be > 0 (seconds)")
    if r.partial_rollouts and (r.max_staleness < 1 or r.executor != "local"):
        raise ConfigError(
            "rollout.partial_rollouts needs max_staleness >= 1 and executor = 'local' "
            f"(got max_staleness = {r.max_staleness}, executor = {r.executor!r}); "
            "set partial_rollouts = false"
        )
    if not r.unit_timeout_s > 0:
        raise ConfigError("rollout.unit_timeout_s must be > 0 (seconds)")
    if r.engine == "vllm":
        from cadenza.rl.engines.vllm_server import vllm_installed

        if not vllm_installed(r.engine_options.get("python")):
            raise ConfigError(
                "rollout.engine = 'vllm' needs vLLM, which is not installed; run: "
                "python -m cadenza.rl.engines.install (or make test, which runs it)"
            )
    if r.engines < 1:
        raise ConfigError(f"rollout.engines must be >= 1, got {r.engines}")
    if r.sync_probe_tol < 0 or (r.sync_probe_tol > 0 and r.engine != "vllm"):
        raise ConfigError("rollout.sync_probe_tol must be >= 0 and needs engine = 'vllm' (0 = off)")
    if r.engines > 1 and r.engine != "vllm":
        raise ConfigError(f"rollout.engines = {r.engines} needs engine = 'vllm' (servers cadenza starts)")
    if r.engines > 1 and r.engine_options.get("port"):
        raise ConfigError(
            "rollout.engine_options.port fixes one port but rollout.engines > 1; "
            "drop it (free ports are picked)"
        )
    if r.executor not in ("local", "ray"):
        raise ConfigError(f"rollout.executor = {r.executor!r} is not allowed; use 'local' or 'ray'")
    if r.executor == "ray":
        if r.workers < 1:
            raise ConfigError(f"rollout.workers must be >= 1 with executor = 'ray', got {r.workers}")
        from cadenza.executor import ExecutorConfig, preflight

        try:
            preflight(ExecutorConfig(kind="ray", ray_address=r.ray_address))
        except CadenzaError as exc:  # the same one line, as a config error
            raise ConfigError(str(exc)) from None
    if r.engine == "openai":
        raise ConfigError(
            "rollout.engine = 'openai' is an external server cadenza cannot load new weights into, so it "
            "cannot train; use 'vllm' (started and synced by cadenza) or 'hf'; openai servers serve cadenza "
            "eval"
        )


def _resolve(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Parse and validate a TOML config; relative paths resolve against the config file's directory."""
    path = Path(path)
    cfg = from_dict(TrainConfig, apply_overrides(read_toml(path), overrides or {}))
    validate(cfg, path.parent.resolve())
    return cfg
