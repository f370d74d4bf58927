"""Joining a torchrun job, and work done once on rank 0 with its outcome shared by every rank.

Both trainers (``cadenza pretrain`` and ``cadenza train``) start the same way: under torchrun the
environment names the rank and world size and the group is joined through ``env://``; a single
process gets a private in-memory group (a ``TCPStore`` would listen on every interface, see
docs/design.md). ``CADENZA_INIT_METHOD`` overrides the rendezvous (e.g. ``file:///shared/rdzv``): a
job launched like torchrun but meeting through a shared file, which is how the tests run the real
CLI on several ranks without a TCP store.
"""

from __future__ import annotations

import datetime
import os
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from cadenza.errors import CadenzaError, ConfigError

T = TypeVar("T")


def launched_ranks() -> int:
    """The world size torchrun (or a launcher setting the same variables) started; 1 otherwise."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return 1


def init_distributed(
    *, single_process_group: bool = True, timeout_s: float | None = None
) -> tuple[bool, str]:
    """Join the launched group (or, if ``single_process_group``, make a one-process one); returns
    (created here, device). ``timeout_s``: the longest a collective waits for the other ranks (torch's
    default, 30 min, when None), so a rank that died or hangs ends the job instead of stalling it."""
    cuda = torch.cuda.is_available()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return False, device
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        init_method = os.environ.get("CADENZA_INIT_METHOD", "env://")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, **timeout)
    elif single_process_group:  # a private in-memory group (a TCPStore would listen on every interface)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        return False, device
    return True, device


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "imed out")


def collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank died, hung or left."""
    if isinstance(exc, dist.DistError):  # DistBackendError, DistNetworkError, DistStoreError
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("gloo" in text or any(m in text for m in _PEER_GONE))


def share_from_rank0(fn: Callable[[], T], *, result_to_all: bool = True) -> T:
    """Run ``fn`` on rank 0 only; every rank returns its result (``result_to_all``) or raises its error.

    A rank-0 failure must reach the other ranks, or they wait in the next collective until the group
    times out. Rank 0 raises its own error; the others raise a user error (``CadenzaError``) as itself
    when it pickles (``PoolExhausted`` stays ``PoolExhausted``), anything else as
    ``RuntimeError("rank 0 failed: ...")``.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return fn()
    box: list[Any] = [None]
    result: Any = None
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            result = fn()
            box[0] = ("ok", result if result_to_all else None)
        except Exception as exc:
            failure = exc
            box[0] = ("error", _portable(exc))
    dist.broadcast_object_list(box, src=0)
    status, payload = box[0]
    if status == "ok":
        return result if dist.get_rank() == 0 else payload
    if failure is not None:  # rank 0 raises its own error, traceback and all
        raise failure
    raise payload


def _portable(exc: Exception) -> Exception:
    """What the other ranks raise for ``exc``: itself if it is a user error that pickles."""
    if isinstance(exc, CadenzaError):
        try:
            return pickle.loads(pickle.dumps(exc))
        except Exception:
            return ConfigError(str(exc))
    return RuntimeError(f"rank 0 failed: {type(exc).__name__}: {exc}")
