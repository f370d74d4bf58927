"""The pretraining config: one TOML file, one dataclass per section, unknown keys rejected.

```toml
[model]        path = "hf-model-dir"            # config.json + weights (+ tokenizer)
[data]         files = ["corpus.jsonl"]; seq_len = 2048; text_field = "text"
[parallel]     dp_replicate = 1; dp_shard = -1; cp = 1; ep = 8
[train]        steps = 1000; global_batch = 64; lr = 3e-4; schedule = "wsd"; optimizer = "adamw"
[muon]         granular = true; adjust_lr = "match_rms_adamw"   # only with optimizer = "muon"
[checkpoint]   every = 100; keep = 2
[output]       dir = "runs/pt1"
```
Relative paths are resolved against the config file's directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cadenza.config_io import from_dict, read_toml
from cadenza.errors import need
from cadenza.optim.config import OPTIMIZERS, MuonConfig
from cadenza.parallel.dims import ParallelDims


@dataclass(kw_only=True)
class PretrainModelConfig:
    """The model to continue pretraining: a Hugging Face model folder (config.json + safetensors)."""

    path: str  # the HF model directory
    tokenizer: str = ""  # a tokenizer directory; defaults to the model path
    param_dtype: str = "float32"  # FSDP2 compute dtype of the parameters (float32 | bfloat16)
    reduce_dtype: str = "float32"  # dtype of the gradient reduce-scatter
    activation_checkpointing: bool = False  # recompute each decoder layer in backward (less memory)


@dataclass(kw_only=True)
class DataConfig:
    """Local text corpora, tokenized once (cached in <output.dir>/cache) and packed into fixed-length rows."""

    files: list[str]  # .txt, .jsonl or .parquet files (parquet needs cadenza[parquet])
    seq_len: int = 1024  # tokens per packed sequence; divisible by 2·parallel.cp
    text_field: str = "text"  # JSONL key / parquet column
    seed: int = 0  # shuffle seed of the packed rows


@dataclass(kw_only=True)
class PretrainLoopConfig:
    """The ``[train]`` section: steps, batch, learning-rate schedule and optimizer."""

    steps: int  # optimizer steps
    global_batch: int = 8  # sequences per optimizer step, split over the data-parallel ranks
    micro_batch: int = 0  # sequences per forward on one rank (gradient accumulation); 0 = all at once
    lr: float = 3e-4  # peak learning rate (Muon's too, with muon.adjust_lr = "match_rms_adamw")
    min_lr_ratio: float = 0.1  # the schedule's floor, as a fraction of lr
    warmup_steps: int = 0  # linear warm-up steps, < steps
    schedule: str = "cosine"  # cosine | wsd | constant
    decay_fraction: float = 0.2  # wsd: last fraction of steps spent decaying
    optimizer: str = "adamw"  # adamw | muon (configured by [muon])
    weight_decay: float = 0.1  # on matrices only; norms and biases never decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW betas (Muon's AdamW groups too)
    max_grad_norm: float = 1.0  # global gradient clipping across both meshes
    seed: int = 0  # torch seed (model init); the data order follows data.seed


@dataclass(kw_only=True)
class CheckpointConfig:
    """Sharded DCP checkpoints; a rerun resumes from the newest one (the same model and dims required)."""

    every: int = 100  # steps between checkpoints
    keep: int = 2  # newest checkpoints kept
    dir: str = ""  # defaults to <output.dir>/checkpoints


@dataclass(kw_only=True)
class OutputConfig:
    dir: str = "runs/pretrain"  # run directory: metrics.jsonl, checkpoints/, the tokenized corpus
    progress: bool = True  # a progress bar on rank 0


@dataclass(kw_only=True)
class PretrainConfig:
    model: PretrainModelConfig
    data: DataConfig
    train: PretrainLoopConfig
    parallel: ParallelDims = field(default_factory=ParallelDims)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.output.dir) / "checkpoints"


def load_config(path: str | Path) -> PretrainConfig:
    """Parse and validate ``path`` with the shared strict loader; every problem is a one-line ConfigError."""
    path = Path(path)
    cfg = from_dict(PretrainConfig, read_toml(path))
    base = path.parent
    cfg.model.path = str(_resolve(base, cfg.model.path))
    if cfg.model.tokenizer:
        cfg.model.tokenizer = str(_resolve(base, cfg.model.tokenizer))
    cfg.data.files = [str(_resolve(base, f)) for f in cfg.data.files]
    cfg.output.dir = str(_resolve(base, cfg.output.dir))
    if cfg.checkpoint.dir:
        cfg.checkpoint.dir = str(_resolve(base, cfg.checkpoint.dir))
    validate(cfg)
    return cfg


def _resolve(base: Path, p: str) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() else (base / q)


def validate(cfg: PretrainConfig) -> None:
    """Checks that need no model and no process group."""
    t, d = cfg.train, cfg.data
    need(t.steps >= 1, f"train.steps must be >= 1, got {t.steps}")
    need(t.global_batch >= 1, f"train.global_batch must be >= 1, got {t.global_batch}")
    need(t.micro_batch >= 0, f"train.micro_batch must be >= 0 (0 = no accumulation), got {t.micro_batch}")
    need(t.lr > 0, f"train.lr must be > 0, got {t.lr}")
    need(
        t.schedule in ("cosine", "wsd", "constant"),
        f"train.schedule must be cosine, wsd or constant, got {t.schedule!r}",
    )
    need(
        0 <= t.min_lr_ratio <= 1 and 0 < t.decay_fraction <= 1,
        "train.min_lr_ratio must be in [0, 1] and train.decay_fraction in (0, 1]",
    )
    need(0 <= t.warmup_steps < t.steps, f"train.warmup_steps must be in [0, steps), got {t.warmup_steps}")
    need(
        t.optimizer in OPTIMIZERS,
        f"unknown train.optimizer {t.optimizer!r}; choose one of {list(OPTIMIZERS)}",
    )
    cfg.muon.check()
    need(len(t.betas) == 2, f"train.betas must be two numbers, got {t.betas}")
    need(d.seq_len >= 2, f"data.seq_len must be >= 2, got {d.seq_len}")
    need(bool(d.files), "data.files is empty; list local .txt, .jsonl or .parquet files")
    for f in d.files:
        need(Path(f).is_file(), f"data file {f} does not exist")
    need(
        cfg.checkpoint.every >= 1 and cfg.checkpoint.keep >= 1,
        "checkpoint.every and checkpoint.keep must be >= 1",
    )
    need(
        Path(cfg.model.path).is_dir(),
        f"model.path {cfg.model.path} is not a directory (a Hugging Face model folder)",
    )
    need(
        d.seq_len % (2 * cfg.parallel.cp) == 0,
        f"data.seq_len={d.seq_len} is not divisible by 2·cp = {2 * cfg.parallel.cp}",
    )
