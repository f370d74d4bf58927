"""Muon at the model's own granularity, with AdamW groups, on plain tensors or FSDP2 DTensors.

For one matrix (a whole 2-D weight, one head, one expert) the update matches ``torch.optim.Muon``::

    buf = μ·buf + (1−μ)·g;  u = (1−μ)·g + μ·buf  (nesterov) or buf;  ortho = NS(u)
    W ← W·(1 − lr·wd) − lr·s·O,  s = sqrt(max(1, A/B)) ("original") or 0.2·sqrt(max(A, B)) ("match_rms_adamw")

Momentum is elementwise, so it runs on local shards. Orthogonalisation needs whole matrices: the
step is planned once (:mod:`cadenza.optim.plan`), then jobs gather shards with ``all_to_all_single``,
run batched NS on the matrices each rank owns and send results back, several in flight at once
(:mod:`cadenza.optim.runtime`). The result equals the unsharded optimizer at the same granularity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from cadenza.errors import ConfigError
from cadenza.optim.granularity import blocks, box_matrix_shape
from cadenza.optim.layout import check_layout, comm_group, is_dtensor, layout_of, local
from cadenza.optim.newton_schulz import DEFAULT_COEFFICIENTS, coefficient_schedule, newton_schulz
from cadenza.optim.plan import Entry, JobPlan, build_plan, comm_dtype
from cadenza.optim.runtime import RuntimeStats, run_jobs

ALGORITHMS = ("muon", "adamw")
ADJUST_LR = ("original", "match_rms_adamw")


def adjusted_ratio(adjust_lr: str, A: int, B: int) -> float:
    """The factor ``s`` on the learning rate for an ``A x B`` orthogonalised matrix."""
    if adjust_lr == "original":
        return math.sqrt(max(1.0, A / B))
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(A, B))
    raise ConfigError(f"unknown adjust_lr {adjust_lr!r}; use one of {ADJUST_LR}")


class Muon(torch.optim.Optimizer):
    """One optimizer for the whole model: ``algorithm="muon"`` groups (granularity ``matrix``, ``head``
    or ``expert``) and ``algorithm="adamw"`` groups (embeddings, heads, norms, biases).

    ``max_in_flight`` bounds concurrent transfers in the sharded path; ``bucket_numel`` bounds the
    elements one job gathers; ``replicate_split`` lets replicas (HSDP) split whole-matrix work and
    share results instead of each computing every matrix.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
        ns_coefficients: Any = DEFAULT_COEFFICIENTS,
        ns_dtype: torch.dtype = torch.bfloat16,
        eps: float = 1e-7,
        adjust_lr: str = "original",
        algorithm: str = "muon",
        granularity: str = "matrix",
        head_dim: int | None = None,
        head_axis: int = 0,
        split_sizes: tuple[int, ...] | None = None,
        betas: tuple[float, float] = (0.9, 0.95),
        adam_eps: float = 1e-8,
        *,
        max_in_flight: int = 4,
        bucket_numel: int = 1 << 24,
        replicate_split: bool = True,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            ns_steps=ns_steps,
            ns_coefficients=ns_coefficients,
            ns_dtype=ns_dtype,
            eps=eps,
            adjust_lr=adjust_lr,
            algorithm=algorithm,
            granularity=granularity,
            head_dim=head_dim,
            head_axis=head_axis,
            split_sizes=split_sizes,
            betas=betas,
            adam_eps=adam_eps,
        )
        if max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.bucket_numel = bucket_numel
        self.replicate_split = replicate_split
        self.last_stats = RuntimeStats()
        self._plan_cache: tuple[tuple, list[JobPlan], list[Entry]] | None = None
        super().__init__(params, defaults)
        for gi, group in enumerate(self.param_groups):
            self._validate_group(group, gi)

    # -- construction-time checks: every mistake surfaces here, not at step 1000 ----------------
    @staticmethod
    def _validate_group(group: dict, gi: int) -> None:
        if group["algorithm"] not in ALGORITHMS:
            raise ConfigError(
                f"param group {gi}: unknown algorithm {group['algorithm']!r}; use one of {ALGORITHMS}"
            )
        for key in ("lr", "weight_decay"):
            if not group[key] >= 0:
                raise ConfigError(f"param group {gi}: {key} must be >= 0, got {group[key]}")
        if group["algorithm"] == "adamw":
            b1, b2 = group["betas"]
            if not (0 <= b1 < 1 and 0 <= b2 < 1):
                raise ConfigError(f"param group {gi}: betas must be in [0, 1), got {group['betas']}")
            return
        if not 0 <= group["momentum"] < 1:
            raise ConfigError(f"param group {gi}: momentum must be in [0, 1), got {group['momentum']}")
        if group["adjust_lr"] not in ADJUST_LR:
            raise ConfigError(
                f"param group {gi}: unknown adjust_lr {group['adjust_lr']!r}; use one of {ADJUST_LR}"
            )
        coefficient_schedule(group["ns_coefficients"], group["ns_steps"])
        if not group["ns_dtype"].is_floating_point:
            raise ConfigError(f"param group {gi}: ns_dtype must be a floating dtype, got {group['ns_dtype']}")
        names = group.get("param_names") or []
        for j, p in enumerate(group["params"]):
            name = names[j] if j < len(names) else f"param {j} of group {gi}"
            blocks(
                p.shape,
                group["granularity"],
                head_dim=group["head_dim"],
                head_axis=group["head_axis"],
                split_sizes=group["split_sizes"],
                name=name,
            )
            check_layout(p, name)

    # -- step ------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon_params: list[tuple[torch.Tensor, dict, torch.Tensor]] = []
        for group in self.param_groups:
            if group["algorithm"] == "adamw":
                self._adamw(group)
            else:
                muon_params.extend(
                    (p, group, self._momentum(p, group)) for p in group["params"] if p.grad is not None
                )
        if muon_params:
            self._orthogonalise_and_apply(muon_params)
        return loss

    def _momentum(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        g = p.grad
        if is_dtensor(p) and (not is_dtensor(g) or g.placements != p.placements):
            raise ConfigError(
                "a Muon parameter's gradient must be a DTensor with the parameter's placements "
                f"(got {getattr(g, 'placements', 'a plain tensor')} for {p.placements})"
            )
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf, g = local(state["momentum_buffer"]), local(g)
        mu = group["momentum"]
        buf.lerp_(g, 1 - mu)
        return g.lerp(buf, mu) if group["nesterov"] else buf

    def _plan(
        self, muon_params: list[tuple[torch.Tensor, dict, torch.Tensor]]
    ) -> tuple[list[JobPlan], list[Entry]]:
        key = tuple(
            (
                id(p),
                id(g),
                g["granularity"],
                g["head_dim"],
                g["head_axis"],
                g["split_sizes"],
                g["adjust_lr"],
                g["ns_steps"],
                str(g["ns_coefficients"]),
                g["ns_dtype"],
                g["eps"],
            )
            for p, g, _ in muon_params
        )
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return self._plan_cache[1], self._plan_cache[2]
        entries = []
        for p, g, _ in muon_params:
            boxes = blocks(
                p.shape,
                g["granularity"],
                head_dim=g["head_dim"],
                head_axis=g["head_axis"],
                split_sizes=g["split_sizes"],
            )
            schedule = tuple(coefficient_schedule(g["ns_coefficients"], g["ns_steps"]))
            ns_key = (schedule, g["ns_dtype"], g["eps"], p.dtype)
            entries.append(
                Entry(
                    shape=tuple(p.shape),
                    layout=layout_of(p),
                    group=comm_group(p) if is_dtensor(p) else None,
                    boxes=boxes,
                    ratios=[adjusted_ratio(g["adjust_lr"], *box_matrix_shape(b)) for b in boxes],
                    ns_key=ns_key,
                    steps=g["ns_steps"],
                )
            )
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        plans = build_plan(
            entries, rank=rank, bucket_numel=self.bucket_numel, replicate_split=self.replicate_split
        )
        self._plan_cache = (key, plans, entries)
        return plans, entries

    def _orthogonalise_and_apply(self, muon_params: list[tuple[torch.Tensor, dict, torch.Tensor]]) -> None:
        plans, _ = self._plan(muon_params)
        updates = [u for _, _, u in muon_params]
        outs = [torch.empty_like(u) for u in updates]
        self.last_stats = run_jobs((_job(jp, updates, outs) for jp in plans), self.max_in_flight)
        for (p, g, _), o in zip(muon_params, outs, strict=True):
            w = local(p)
            w.mul_(1 - g["lr"] * g["weight_decay"])
            w.add_(o, alpha=-g["lr"])

    def _adamw(self, group: dict) -> None:
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "exp_avg" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            w, g, m, v = local(p), local(p.grad), local(state["exp_avg"]), local(state["exp_avg_sq"])
            w.mul_(1 - lr * wd)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(group["adam_eps"])
            w.addcdiv_(m, denom, value=-lr / (1 - b1**t))


def _job(jp: JobPlan, updates: list[torch.Tensor], outs: list[torch.Tensor]):
    """Gather owned matrices, orthogonalise them batched, scatter results (a generator for run_jobs)."""
    schedule, ns_dtype, eps, pdtype = jp.ns_key
    ns_steps = len(schedule)
    cdt = comm_dtype(pdtype, ns_dtype)
    A, B = jp.shape
    buf = torch.empty((len(jp.owned_ext), A, B), dtype=cdt)
    for e, lsl, pos, bsl in jp.local_in:
        buf[pos].view(jp.owned_ext[pos])[bsl].copy_(updates[e][lsl])
    if jp.comm:
        send = _cat([updates[e][lsl] for e, lsl in jp.send_in], cdt)
        recv = torch.empty(sum(jp.recv_in_splits), dtype=cdt)
        yield dist.all_to_all_single(
            recv, send, jp.recv_in_splits, jp.send_in_splits, group=jp.group, async_op=True
        )
        off = 0
        for pos, bsl, ext, n in jp.recv_in:
            buf[pos].view(jp.owned_ext[pos])[bsl].copy_(recv[off : off + n].view(ext))
            off += n
    if len(jp.owned_ext) == 1:  # the 2-D path reduces exactly like torch.optim.Muon
        ortho = newton_schulz(buf[0], ns_steps, schedule, ns_dtype, eps)[None]
    elif jp.owned_ext:
        ortho = newton_schulz(buf, ns_steps, schedule, ns_dtype, eps)
    else:
        ortho = buf.to(ns_dtype)
    for pos, bsl, e, lsl, ratio in jp.local_out:
        _put(outs[e][lsl], ortho[pos].view(jp.owned_ext[pos])[bsl], ratio)
    if jp.comm:
        send = _cat([ortho[pos].view(jp.owned_ext[pos])[bsl] for pos, bsl in jp.send_out], ortho.dtype)
        recv = torch.empty(sum(jp.recv_out_splits), dtype=ortho.dtype)
        yield dist.all_to_all_single(
            recv, send, jp.recv_out_splits, jp.send_out_splits, group=jp.group, async_op=True
        )
        off = 0
        for e, lsl, ext, n, ratio in jp.recv_out:
            _put(outs[e][lsl], recv[off : off + n].view(ext), ratio)
            off += n


def _cat(pieces: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    if not pieces:
        return torch.empty(0, dtype=dtype)
    return torch.cat([p.reshape(-1) for p in pieces]).to(dtype)


def _put(dst: torch.Tensor, src: torch.Tensor, ratio: float) -> None:
    dst.copy_(src)
    if ratio != 1.0:
        dst.mul_(ratio)
