"""Checks of a trainer config: :func:`validate` (the config alone, once), :func:`machine_checks` (what
the machine must have, run by the commands' preflight) and :func:`load_config` (TOML -> checked config).

Every mistake (unknown key, wrong type, impossible value, missing model path) is a one-line
:class:`ConfigError` naming the key and the fix, raised before any compute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadenza.config_io import apply_overrides, from_dict, read_toml
from cadenza.errors import CadenzaError, ConfigError, need
from cadenza.rl.config.sections import RolloutConfig, TrainConfig


def validate(cfg: TrainConfig, base: Path = Path(".")) -> None:
    """Value checks that need no compute: ranges, cross-field rules, paths that must exist.

    It looks at the config alone: what the machine has (vLLM, Ray, wandb) is :func:`machine_checks`,
    which the commands run in their preflight. A validated config is marked, so that the trainer
    (:func:`ensure_valid`) does not check it a second time."""
    need(cfg.run.steps >= 1, "run.steps must be >= 1")
    need(cfg.run.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = only at the end)")
    need(cfg.run.threads >= 0, "run.threads must be >= 0 (0 = torch's default)")
    need(cfg.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1")
    need(cfg.run.collective_timeout_s > 0, "run.collective_timeout_s must be > 0 (seconds)")
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
    vars(cfg)[_VALIDATED] = True


_VALIDATED = "_validated"  # set on a config instance by validate(); not a field, so never serialised


def ensure_valid(cfg: TrainConfig) -> None:
    """Validate a config that :func:`validate` (or :func:`load_config`) has not seen yet (library use)."""
    if not vars(cfg).get(_VALIDATED):
        validate(cfg)


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
    validate_long_tail(r)
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
    if r.engine_placement not in ("local", "ray") or (r.engine_placement == "ray" and r.engine != "vllm"):
        raise ConfigError(  # "ray" places vLLM servers
            f"rollout.engine_placement = {r.engine_placement!r} with engine = {r.engine!r} is not allowed; "
            "use 'local', or 'ray' with engine = 'vllm'"
        )
    bad = {k: v for k, v in r.engine_resources.items() if not isinstance(v, int | float) or v < 0}
    if bad:
        raise ConfigError(f"rollout.engine_resources {bad}: amounts must be numbers >= 0, e.g. {{GPU = 1}}")
    if r.executor not in ("local", "ray"):
        raise ConfigError(f"rollout.executor = {r.executor!r} is not allowed; use 'local' or 'ray'")
    if r.executor == "ray" and r.workers < 1:
        raise ConfigError(f"rollout.workers must be >= 1 with executor = 'ray', got {r.workers}")
    if r.engine == "openai":
        raise ConfigError(
            "rollout.engine = 'openai' is an external server cadenza cannot load new weights into, so it "
            "cannot train; use 'vllm' (started and synced by cadenza) or 'hf'; openai servers serve cadenza "
            "eval"
        )


def validate_long_tail(r: RolloutConfig) -> None:
    """``oversample_groups`` / ``min_finished_groups``: in range, and only where the cut is built."""
    drawn = r.tasks_per_step + r.oversample_groups
    if r.oversample_groups < 0:
        raise ConfigError(f"rollout.oversample_groups must be >= 0 (0 = off), got {r.oversample_groups}")
    if not 0 <= r.min_finished_groups <= drawn:
        raise ConfigError(
            f"rollout.min_finished_groups = {r.min_finished_groups} must be in [0, {drawn}] "
            "(tasks_per_step + oversample_groups; 0 = tasks_per_step)"
        )
    if (r.min_finished_groups or r.tasks_per_step) < drawn and r.executor != "local":
        raise ConfigError(
            "rollout.oversample_groups / min_finished_groups (long-tail control) need executor = 'local'; "
            f"got {r.executor!r} (set oversample_groups = 0 and min_finished_groups = 0)"
        )


def engine_checks(r: RolloutConfig) -> list[Callable[[], None]]:
    """What the machine must have for these rollouts (vLLM installed, Ray reachable): preflight checks,
    each raising one line; probes of the machine, so never part of :func:`validate`."""
    checks: list[Callable[[], None]] = []
    if r.engine == "vllm":
        checks.append(lambda: _check_vllm(r.engine_options.get("python")))
    if r.executor == "ray" or r.engine_placement == "ray":
        checks.append(lambda: _check_ray(r.ray_address))
    return checks


def machine_checks(cfg: TrainConfig) -> list[Callable[[], None]]:
    """:func:`engine_checks` plus the run's optional loggers (wandb)."""
    checks = engine_checks(cfg.rollout)
    if cfg.run.wandb:
        from cadenza.metrics import require_wandb

        checks.append(require_wandb)
    return checks


def _check_vllm(python: str | None) -> None:
    from cadenza.rl.engines.vllm_server import vllm_installed

    if not vllm_installed(python):
        raise ConfigError(
            "rollout.engine = 'vllm' needs vLLM, which is not installed; run: "
            "python -m cadenza.rl.engines.install (or make test, which runs it)"
        )


def _check_ray(address: str | None) -> None:
    from cadenza.executor import ExecutorConfig, preflight

    try:
        preflight(ExecutorConfig(kind="ray", ray_address=address))
    except CadenzaError as exc:  # the same one line, as a config error
        raise ConfigError(str(exc)) from None


def _resolve(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Parse and validate a TOML config; relative paths resolve against the config file's directory."""
    path = Path(path)
    cfg = from_dict(TrainConfig, apply_overrides(read_toml(path), overrides or {}))
    validate(cfg, path.parent.resolve())
    return cfg
