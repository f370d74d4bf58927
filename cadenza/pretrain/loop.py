"""The continued-pretraining job: config → dual-mesh model → packed batches → optimizer steps → checkpoints.

Launched with torchrun (or as one process); every rank runs :func:`run`. Everything a user can get
wrong (dims, model, data, checkpoint) is checked identically on every rank before the first
collective, or found on rank 0 and broadcast, so a mistake ends the job with one clear error
instead of a hang.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from cadenza.errors import ConfigError
from cadenza.metrics import MetricsLogger
from cadenza.optim.build import build_optimizer
from cadenza.optim.clip import clip_grad_norm_
from cadenza.parallel import ParallelOptions, parallelize
from cadenza.parallel.launch import init_distributed, share_from_rank0
from cadenza.parallel.parallelize import check_model
from cadenza.pretrain import checkpoint
from cadenza.pretrain.config import PretrainConfig
from cadenza.pretrain.data import PackedDataset, load_tokens
from cadenza.pretrain.schedule import schedule_of


def _load_model(cfg: PretrainConfig):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = cfg.model.path
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"model.path {path} has no config.json; point it at a Hugging Face model folder")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the model from {path}: {str(exc).splitlines()[0]}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load a tokenizer from {cfg.model.tokenizer or path} ({str(exc).splitlines()[0]}); "
            "set model.tokenizer"
        ) from None
    return model, tokenizer


@contextmanager
def _progress(enabled: bool, total: int, start: int):
    """A rich progress bar on rank 0 (``None`` elsewhere)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("pretrain"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    ) as progress:
        progress.add_task("steps", total=total, completed=start, info="")
        yield progress


def _accumulate(pm, chunks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Forward/backward each micro-batch; gradients are reduced once, after the last one.

    Packed blocks have no ignored labels, so every micro-batch has the same token count and the
    mean of their losses is the loss of the whole batch.
    """
    total = torch.zeros((), device=chunks[0].device)
    for i, chunk in enumerate(chunks):
        pm.model.set_requires_gradient_sync(i == len(chunks) - 1)
        loss = pm(input_ids=chunk, labels=chunk).loss / len(chunks)
        loss.backward()
        total += loss.detach()
    return total


def run(cfg: PretrainConfig) -> dict:
    """Train ``cfg.train.steps`` steps (resuming from the newest checkpoint); returns a summary on every
    rank."""
    created, device = init_distributed()
    try:
        return _run(cfg, device)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


def _run(cfg: PretrainConfig, device: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = cfg.parallel.resolve(world)
    t = cfg.train
    if t.global_batch % dims.dp:
        raise ConfigError(
            f"train.global_batch={t.global_batch} is not divisible by the data-parallel degree "
            f"{dims.dp} (world {world} / cp {dims.cp}); change global_batch or the dims"
        )
    per_rank = t.global_batch // dims.dp
    micro = t.micro_batch or per_rank
    if per_rank % micro:
        raise ConfigError(
            f"train.micro_batch={micro} does not divide the {per_rank} sequences each data-parallel "
            f"rank takes per step (global_batch {t.global_batch} / dp {dims.dp})"
        )
    model, tokenizer = _load_model(cfg)
    check_model(model, dims)
    fp = checkpoint.fingerprint(model)
    found = checkpoint.latest(cfg.checkpoint_dir)
    if found:
        checkpoint.check_compatible(found[1], fp, found[0])
    out_dir = Path(cfg.output.dir)
    tokens_path = share_from_rank0(
        lambda: load_tokens(cfg.data.files, cfg.data.text_field, tokenizer, out_dir / "cache", write=True),
        result_to_all=False,
    )
    if rank != 0:
        tokens_path = load_tokens(
            cfg.data.files, cfg.data.text_field, tokenizer, out_dir / "cache", write=False
        )
    dataset = PackedDataset(np.load(tokens_path, mmap_mode="r"), cfg.data.seq_len, cfg.data.seed)

    torch.manual_seed(t.seed)
    options = ParallelOptions(
        param_dtype=cfg.model.param_dtype,
        reduce_dtype=cfg.model.reduce_dtype,
        activation_checkpointing=cfg.model.activation_checkpointing,
    )
    model.to(device)
    pm = parallelize(model, dims, options, device_type=device.split(":")[0])
    optimizer = build_optimizer(
        t.optimizer, pm.model, lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas), muon=cfg.muon
    )
    start = 0
    if found:
        checkpoint.load(found[0], pm.model, optimizer)
        start = int(found[1]["step"])
    meta = {
        "fingerprint": fp,
        "world_size": world,
        "dims": vars(dims),
        "global_batch": t.global_batch,
        "seq_len": cfg.data.seq_len,
    }
    metrics = MetricsLogger(out_dir, resume_step=start, enabled=rank == 0)
    dp_rank = dims.dp_rank(rank)
    lr_of = schedule_of(t)
    last = {}
    pm.train()
    with _progress(cfg.output.progress and rank == 0, t.steps, start) as progress:
        for step in range(start + 1, t.steps + 1):
            t0 = time.perf_counter()
            lr = lr_of(step)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's AdamW groups may run at another lr
            ids = dataset.batch(step, t.global_batch, dp_rank, dims.dp).to(device)
            loss = _accumulate(pm, ids.split(micro))
            grad_norm = clip_grad_norm_(list(pm.parameters()), t.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mean_loss = loss.detach().clone()
            dist.all_reduce(
                mean_loss
            )  # every CP rank holds its batch's loss: the world mean is the batch mean
            last = {
                "step": step,
                "loss": float(mean_loss) / world,
                "lr": lr,
                "grad_norm": float(grad_norm),
                "tokens": step * t.global_batch * cfg.data.seq_len,
                "seconds": time.perf_counter() - t0,
                "world_size": world,
            }
            metrics.log(step, last)
            if progress is not None:
                progress.update(progress.task_ids[0], completed=step, info=f"loss {last['loss']:.4f}")
            if step % cfg.checkpoint.every == 0 or step == t.steps:
                checkpoint.save(cfg.checkpoint_dir, step, pm.model, optimizer, meta, keep=cfg.checkpoint.keep)
    return {
        "start_step": start,
        "last": last,
        "metrics": str(out_dir / "metrics.jsonl"),
        "checkpoints": str(cfg.checkpoint_dir),
    }
