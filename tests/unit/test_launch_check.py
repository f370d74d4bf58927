"""The launch checks of ``cadenza train`` (``cadenza.preflight.for_launch``): files only, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadenza import checkpoint as lifecycle
from cadenza.errors import ConfigError
from cadenza.preflight import check_launch
from cadenza.preflight import for_launch as preflight
from cadenza.rl.config import ParallelDims, TrainConfig
from cadenza.rl.train.build import check_same_run

QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_experts": 8}


def _cfg(tmp: Path, model: dict | None = QWEN3_MOE, **dims: int) -> TrainConfig:
    cfg = TrainConfig()
    cfg.run.out_dir = str(tmp / "run")
    if model is not None:
        (tmp / "model").mkdir(exist_ok=True)
        (tmp / "model" / "config.json").write_text(json.dumps(model))
        cfg.model.path = str(tmp / "model")
    cfg.parallel = ParallelDims(**dims)
    return cfg


def _checkpoint(cfg: TrainConfig, arch: dict) -> Path:
    tmp = lifecycle.staging(Path(cfg.run.out_dir) / "checkpoints", 2)
    return lifecycle.publish(tmp, 2, {"format": "dcp", "arch": arch}, keep=2)


def test_dims_that_do_not_divide_the_world(tmp_path):
    with pytest.raises(ConfigError, match="not divisible by dp_replicate·cp"):
        check_launch(_cfg(tmp_path, cp=2), 3, resume=True)


def test_experts_not_divisible_by_ep_read_from_config_json(tmp_path):
    with pytest.raises(ConfigError, match=r"parallel.ep = 3 does not divide the number of experts \(8\)"):
        check_launch(_cfg(tmp_path, ep=3), 3, resume=True)
    with pytest.raises(ConfigError, match="names no routed experts"):
        check_launch(_cfg(tmp_path, {"model_type": "qwen3", "hidden_size": 64}, ep=2), 2, resume=True)
    check_launch(_cfg(tmp_path, ep=4), 4, resume=True)  # 8 experts over 4 ranks: fine


def test_a_checkpoint_of_another_model(tmp_path):
    cfg = _cfg(tmp_path, ep=2)
    newest = _checkpoint(cfg, {**QWEN3_MOE, "hidden_size": 128})
    with pytest.raises(ConfigError, match=f"checkpoint {newest} was written for another model"):
        check_launch(cfg, 2, resume=True)
    check_launch(cfg, 2, resume=False)  # --no-resume starts over
    _checkpoint(cfg, QWEN3_MOE)
    check_launch(cfg, 2, resume=True)


def test_only_rank_0_reports(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, ep=3)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit_:
        preflight(cfg, resume=True)
    assert exit_.value.code == 2 and capsys.readouterr() == ("", "")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"parallel\.ep = 3"):
        preflight(cfg, resume=True)


def test_parallel_may_differ_on_resume(tmp_path):
    cfg = _cfg(tmp_path, ep=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    cfg.parallel = ParallelDims(dp_shard=2, ep=1)  # another world size and layout: DCP reshards
    check_same_run(path, cfg)
    cfg.optim.lr *= 2
    with pytest.raises(Exception, match=r"optim\.lr"):
        check_same_run(path, cfg)
