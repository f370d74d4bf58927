"""The process groups cadenza itself starts listen on loopback only: torch's TCPStore server listens on
every interface (``::``) whatever host it is given, so ``cadenza.testing.spawn`` ranks meet through a
FileStore and a single-process ``cadenza pretrain`` group uses an in-memory store."""

from __future__ import annotations

import psutil
import pytest
import torch.distributed as dist

from cadenza.testing import spawn

pytestmark = pytest.mark.distributed

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def _listeners() -> set[str]:
    conns = psutil.Process().net_connections("inet")
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}


def _rank(rank: int, world_size: int) -> list[str]:
    dist.barrier()
    return sorted(_listeners())


def test_spawned_ranks_listen_on_loopback_only():
    for ips in spawn(_rank, 2):
        assert set(ips) <= LOOPBACK, ips


def test_a_single_process_pretrain_group_listens_on_loopback_only():
    from cadenza.parallel.launch import init_distributed

    made, _ = init_distributed()
    try:
        assert made and dist.get_world_size() == 1
        assert _listeners() <= LOOPBACK, _listeners()
    finally:
        dist.destroy_process_group()
