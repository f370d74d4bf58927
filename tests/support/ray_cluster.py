"""A multi-node Ray cluster simulated on this machine: several raylets, all on 127.0.0.1.

``ray.cluster_utils.Cluster`` starts a head and extra nodes as processes of this one; each node has its
own raylet, object store and node id, so Ray schedules and transfers between them as between machines.
As for cadenza's private cluster (``cadenza/executor/ray.py``): every listener is pinned to loopback
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), the auth token travels in the environment (the process's
one token: Ray caches the first it read) and the session files live in a short directory of the test's,
so nothing is written to ``~/.ray`` or ``/tmp/ray``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cadenza.executor.reaper import reap

ATTEMPTS = 3  # cluster starts tried (each raylet must register within Ray's fixed 30 s)


@contextlib.contextmanager
def loopback_cluster(head: dict[str, Any], *nodes: dict[str, Any]) -> Iterator[tuple[Any, list[str]]]:
    """``(cluster, node ids)``: the head (``num_cpus`` etc.) first, then each of ``nodes`` (e.g.
    ``{"num_cpus": 0, "resources": {"engine": 1}}``). The driver does not connect: pass
    ``cluster.address`` as ``ray_address``. Everything is stopped on exit, and the environment restored."""
    from cadenza.executor.ray import _process_token

    tmp = Path(tempfile.mkdtemp(prefix="crn-", dir="/tmp"))  # Ray's socket paths must stay short
    (tmp / "ray").mkdir()
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _process_token(),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(tmp),  # the cluster's address file (else /tmp/ray/ray_current_cluster)
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    constants = sys.modules.get("ray._private.ray_constants")
    loopback_before = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if "ray" in sys.modules:  # imported earlier in this process: make it re-read its auth mode ...
        with contextlib.suppress(Exception):
            from ray._private.authentication.authentication_token_setup import _enable_token_auth

            _enable_token_auth()
    if constants is not None:  # ... and its loopback setting, read once at import (else the head
        constants.ENABLE_RAY_CLUSTER = False  # advertises the routable address its GCS does not serve)
    from ray.cluster_utils import Cluster

    common = {"node_ip_address": "127.0.0.1", "temp_dir": str(tmp)}
    cluster = None
    try:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                cluster = Cluster(
                    initialize_head=True, head_node_args={"include_dashboard": False, **common, **head}
                )
                added = [cluster.add_node(**common, **n) for n in nodes]
                cluster.wait_for_nodes(timeout=120)
                break
            except Exception as exc:  # Ray waits 30 s (fixed) for a raylet: a loaded machine misses it
                if cluster is not None:
                    with contextlib.suppress(Exception):
                        cluster.shutdown()
                cluster = None
                reap(tmp, keep=True)  # what the failed start left running
                if attempt == ATTEMPTS or "timed out during startup" not in str(exc):
                    raise
                print(f"loopback_cluster: start attempt {attempt} failed ({exc}); retrying", file=sys.stderr)
        yield cluster, [cluster.head_node.node_id, *(n.node_id for n in added)]
    finally:
        if cluster is not None:
            cluster.shutdown()
        reap(tmp, keep=True)  # nothing should be left; a process that is must not outlive the test
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = loopback_before
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        time.sleep(0.5)
        shutil.rmtree(tmp, ignore_errors=True)


SHARED_CPUS = 4  # the shared cluster's CPUs: the most actors one of its tests runs at once


class _Shared:
    """The loopback cluster consecutive tests share (one start and stop instead of one per module)."""

    stack: contextlib.ExitStack | None = None
    address: str = ""


def shared_address() -> str:
    """The address of the shared single-node loopback cluster, started on first use. It is stopped by
    :func:`release_shared` as soon as the next test does not ask for it (a test that kills or stops a
    cluster, or needs several nodes, starts its own with :func:`loopback_cluster`)."""
    if _Shared.stack is None:
        stack = contextlib.ExitStack()
        cluster, _ = stack.enter_context(loopback_cluster({"num_cpus": SHARED_CPUS}))
        _Shared.stack, _Shared.address = stack, cluster.address
    return _Shared.address


def release_shared(next_fixtures: list[str] | None, name: str) -> None:
    """Stop the shared cluster unless the next test (its fixture names; ``None``: no next test) uses the
    fixture ``name`` that hands it out."""
    if _Shared.stack is not None and (next_fixtures is None or name not in next_fixtures):
        stack, _Shared.stack, _Shared.address = _Shared.stack, None, ""
        stack.close()


def listeners() -> list[tuple[str, int, str]]:
    """Every listening socket of this process and its descendants (Ray's processes, engine servers):
    ``(address, port, process name)``, for the loopback-only checks."""
    import psutil

    me = psutil.Process()
    seen = []
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            conns = p.net_connections("inet")
            seen += [(c.laddr.ip, c.laddr.port, p.name()) for c in conns if c.status == psutil.CONN_LISTEN]
    return seen
