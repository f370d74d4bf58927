"""The trainer's TOML sections, each a ``@dataclass(kw_only=True)`` (checked in :mod:`.checks`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from cadenza.errors import ConfigError
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
    # engine = "vllm": "local" = servers as children of the trainer; "ray" = each server in a Ray actor
    # placed on any node that has engine_resources (reached through Ray calls; docs/ray.md)
    engine_placement: Literal["local", "ray"] = "local"
    # engine_placement = "ray": Ray resources per engine ({"GPU": 1}, {"engine": 1}, ...); {} = one GPU
    # where the cluster has GPUs, else one CPU
    engine_resources: dict[str, float] = field(default_factory=dict)
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
    # long-tail control (docs/async.md): groups drawn per step beyond tasks_per_step; the step ends once
    # min_finished_groups groups have finished, and the others are cut whole (logged: groups_cut,
    # episodes_cut). 0 = off
    oversample_groups: int = 0
    min_finished_groups: int = 0  # groups a step waits for (0 = tasks_per_step); fewer than drawn = cut


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
