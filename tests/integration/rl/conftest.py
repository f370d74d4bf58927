"""Fixtures of the rl integration tests, found by name (no imports in the test modules).

``ray_address``: a single-node loopback Ray cluster shared by consecutive tests that ask for it (the Ray
lane's rollout-worker modules: one start and stop instead of one per module), stopped right after the last
of them, before any test that does not ask for it (a test that kills or stops a cluster, or needs several
nodes, starts its own with ``tests.support.ray_cluster.loopback_cluster``).
"""

from __future__ import annotations

import pytest

from tests.support.ray_cluster import release_shared, shared_address


@pytest.fixture
def ray_address() -> str:
    """The shared loopback cluster's address (a cluster start is seconds to tens of seconds under load)."""
    return shared_address()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    release_shared(getattr(nextitem, "fixturenames", None), "ray_address")
