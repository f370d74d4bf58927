"""Engine actors' placement and sync stream, without a cluster (the real 2-node test is
tests/integration/rl/test_engine_ray_nodes.py): resources that fit no node are one line before any
actor is made, and the actor's bucket stream reaches the engine whole or not at all."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CadenzaError, ConfigError, EngineError
from cadenza.rl.engines.ray_engine import EngineActor, ray_options
from cadenza.rl.engines.weights import to_safetensors_bytes

CPU_NODE = {"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9, "node:127.0.0.1": 1.0}}
ENGINE_NODE = {"Alive": True, "Resources": {"CPU": 1.0, "engine": 1.0}}
GPU_NODE = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}


def test_default_resources_are_one_gpu_where_there_are_gpus_else_one_cpu():
    assert ray_options({}, [CPU_NODE]) == {"num_cpus": 1.0, "num_gpus": 0, "resources": {}}
    assert ray_options({}, [CPU_NODE, GPU_NODE]) == {"num_cpus": 0, "num_gpus": 1.0, "resources": {}}
    assert ray_options({"engine": 1}, [CPU_NODE, ENGINE_NODE]) == {
        "num_cpus": 0,
        "num_gpus": 0,
        "resources": {"engine": 1},
    }


def test_resources_no_node_offers_are_one_line_naming_what_nodes_offer():
    with pytest.raises(CadenzaError, match=r"fits no node .*nodes offer: CPU=2, memory=1e\+09\)") as err:
        ray_options({"engine": 1}, [CPU_NODE, {**ENGINE_NODE, "Alive": False}])  # the engine node is dead
    assert "\n" not in str(err.value) and "node:127" not in str(err.value)
    with pytest.raises(CadenzaError, match="fits no node"):
        ray_options({"GPU": 1, "engine": 1}, [GPU_NODE, ENGINE_NODE])  # both on one node, none has both


@pytest.mark.parametrize(
    ("rollout", "match"),
    [
        ({"engine_placement": "ray"}, r"engine_placement = 'ray' with engine = 'hf' is not allowed"),
        ({"engine_placement": "cloud"}, r"engine_placement = 'cloud' .* is not allowed"),
        ({"engine_resources": {"GPU": -1}}, r"engine_resources \{'GPU': -1\}: amounts must be numbers >= 0"),
    ],
)
def test_bad_placement_is_one_line_before_work(rollout, match):
    from cadenza.rl.config import RolloutConfig, TrainConfig, validate

    cfg = TrainConfig()
    cfg.rollout = RolloutConfig(**rollout)
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


class _Engine:
    """Records what a sync streamed; reloads (keeps) it only when the stream ended normally."""

    version = 0

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def sync_weights(self, named, *, version):
        got = dict(named)  # the whole stream, as VLLMEngine._sync consumes it before its reload call
        self.weights, self.version = got, version


def _actor() -> EngineActor:
    actor = EngineActor({})
    actor._engine = _Engine()
    return actor


def test_actor_stream_passes_every_bucket_and_names_them():
    actor = _actor()
    sent = {f"w{i}": torch.full((3,), float(i)) for i in range(5)}
    actor.sync_begin(7, 10.0)
    for items in (list(sent.items())[:2], list(sent.items())[2:]):
        assert actor.sync_bucket(to_safetensors_bytes(items)) == len(items)
    out = actor.sync_end()
    assert out["tensors"] == 5 and sorted(out["names"]) == sorted(sent) and out["version"] == 7
    assert all(torch.equal(actor._engine.weights[k], v) for k, v in sent.items())


def test_aborted_stream_reloads_nothing_and_keeps_the_version():
    """The driver failed mid-sync: the engine must not load a partial set under the new version."""
    actor = _actor()
    actor.sync_begin(3, 10.0)
    actor.sync_bucket(to_safetensors_bytes([("w0", torch.ones(2))]))
    actor.sync_abort()
    assert actor._engine.version == 0 and actor._engine.weights == {}
    with pytest.raises(EngineError, match="no weight sync in progress"):
        actor.sync_end()


class _Remote:
    """``actor.method.remote(...)`` run in this process (the value stands in for its object ref)."""

    def __init__(self, fn) -> None:
        self.remote = fn


class _InProcessActor:
    def __init__(self, actor: EngineActor, *, drop: str | None = None) -> None:
        self._actor, self._drop = actor, drop

    def __getattr__(self, name: str):
        fn = getattr(self._actor, name)
        if name == "sync_bucket" and self._drop:  # a bucket that loses one tensor on the way
            from safetensors.torch import load, save

            def lossy(data: bytes) -> int:
                return fn(save({k: v for k, v in load(data).items() if k != self._drop}))

            return _Remote(lossy)
        return _Remote(fn)


@pytest.mark.parametrize("drop", [None, "w3"])
def test_the_driver_checks_what_the_actor_passed_on(monkeypatch, drop):
    """The trainer -> actor hop is counted like the actor -> engine hop: a lost tensor is one line."""
    from cadenza.rl.engines.ray_engine import RayEngine, RayEnginePlacement

    monkeypatch.setattr(RayEngine, "_get", lambda self, value, what, timeout_s=None: value)
    inner = _actor()
    client = RayEngine(_InProcessActor(inner, drop=drop), {"version": 0}, RayEnginePlacement(bucket_bytes=24))
    sent = [(f"w{i}", torch.full((3,), float(i))) for i in range(5)]  # 12 bytes each: 2 per bucket
    if drop is None:
        client.sync_weights(sent, version=4)
        assert client.version == 4 and sorted(inner._engine.weights) == [n for n, _ in sent]
        return
    with pytest.raises(EngineError, match=r"sent 5 tensors, the engine received 4; first mismatch: 'w3'"):
        client.sync_weights(sent, version=4)
    assert client.version == 0
