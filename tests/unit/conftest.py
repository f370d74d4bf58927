"""One torch thread for the unit tests: their models are tiny (hidden 32-64), where a second intra-op
thread only adds synchronisation, and on a shared 2-core machine it makes a step several times slower
(measured: 0.056 s vs 0.33 s per training step of test_probe's model under load; test_probe 321 s -> 14 s)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread():
    try:
        import torch
    except ImportError:  # the torch-free install runs these tests too
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
