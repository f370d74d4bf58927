"""Shared test setup. Tests run on CPU; distributed tests spawn real gloo process groups.

Markers (declared in pyproject.toml; ``make test`` runs everything, ``make test-fast`` none of these):
``slow`` (real task builds, long end-to-end runs), ``distributed`` (given here to every test under
``tests/distributed/``) and ``network`` (needs the package registry: skipped, with the reason, when
``pip`` cannot reach it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.registry import registry_problem

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DISTRIBUTED_DIR = Path(__file__).parent / "distributed"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(DISTRIBUTED_DIR):
            item.add_marker(pytest.mark.distributed)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("network") is not None:
        problem = registry_problem()
        if problem:
            pytest.skip(f"package registry unreachable ({problem}); this test fetches packages from it")
