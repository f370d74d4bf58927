"""Shared test setup. Tests run on CPU; distributed tests spawn real gloo process groups.

Markers (declared in pyproject.toml; ``make test`` runs everything, ``make test-fast`` none of these):
``slow`` (real task builds, long end-to-end runs), ``distributed`` (given here to every test under
``tests/distributed/``) and ``network`` (needs the package registry: skipped, with the reason, when
``pip`` cannot reach it). ``requires("vllm")`` / ``requires("ray")`` (the second given here to the Ray lane):
skipped when the component is missing, failed instead under ``make test`` (``CADENZA_REQUIRE_ENGINES=1``).

Concurrency (``make test`` runs ``pytest -n 4 --dist loadgroup``; see tests/README.md): the tests marked
``serial`` (vLLM engines) form one xdist group and those marked ``serial("ray")`` (Ray clusters) another, so
each lane runs one test at a time on one worker; every other module is a unit of its own, run on one worker
in order, so its module fixtures are built once.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from tests.support import cpuacct
from tests.support.lanes import decide, engines_required, installed
from tests.support.registry import registry_problem

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DISTRIBUTED_DIR = Path(__file__).parent / "distributed"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (in its own hook of this name)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(DISTRIBUTED_DIR):
            item.add_marker(pytest.mark.distributed)
        if (serial := item.get_closest_marker("serial")) is not None:  # serial("ray"): the lane named "ray"
            item.add_marker(pytest.mark.xdist_group("-".join(["serial", *serial.args])))
            if serial.args == ("ray",):  # a test in the Ray lane starts a cluster: it needs Ray
                item.add_marker(pytest.mark.requires("ray"))
    # The serial lanes are the longest units of work: first, so they are not the tail of the run.
    items.sort(key=lambda item: item.get_closest_marker("serial") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup``, with every test outside a group scheduled with its module (not one by one)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    # Units in collection order, not most-tests-first: distributed and integration modules (few, long
    # tests) start early and the many short unit-test modules fill the tail.
    config.option.loadscopereorder = False

    class ModulesAndGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            grouped = nodeid.rfind("@") > nodeid.rfind("]")  # as xdist's: a parameter may contain '@'
            return nodeid.rsplit("@", 1)[-1] if grouped else nodeid.split("::", 1)[0]

    return ModulesAndGroups(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):  # requires("vllm") / requires("ray"): see tests/support/lanes
        for component in mark.args:
            verdict = decide(component, present=installed(component), required=engines_required())
            if verdict and verdict[0] == "fail":
                pytest.fail(verdict[1], pytrace=False)
            if verdict:
                pytest.skip(verdict[1])
    if item.get_closest_marker("network") is not None:
        problem = registry_problem()
        if problem:
            pytest.skip(f"package registry unreachable ({problem}); this test fetches packages from it")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_TREE: list[Path | None] = []  # this worker's cpuacct group (tests/support/cpuacct.py), made on first use


def _tree_cpu_s() -> float | None:
    if not _TREE:
        _TREE.append(cpuacct.enter(f"cadenza-test-{os.getpid()}"))
    return cpuacct.usage(_TREE[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """With ``CADENZA_TEST_CPU_LOG=FILE``: one JSON line per test (setup, call and teardown together): its
    wall time, the CPU time of the worker plus the children it waited for (``cpu_s``), and of every
    process the worker ever started (``tree_cpu_s``: Ray's and vLLM's processes included; a process a test
    leaves running, such as a module's shared cluster, counts toward the tests that run while it lives;
    ``null`` where the cgroup hierarchy is not writable). tests/README.md, "Where the time goes"."""
    log = os.environ.get("CADENZA_TEST_CPU_LOG")
    t0, c0, g0 = time.monotonic(), _cpu_s() if log else 0.0, _tree_cpu_s() if log else None
    yield
    if log:
        wall, cpu, g1 = round(time.monotonic() - t0, 2), round(_cpu_s() - c0, 2), _tree_cpu_s()
        tree = None if g0 is None or g1 is None else round(g1 - g0, 2)
        row = {"test": item.nodeid, "wall_s": wall, "cpu_s": cpu, "tree_cpu_s": tree}
        with open(log, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _TREE:
        cpuacct.leave(_TREE[0])
