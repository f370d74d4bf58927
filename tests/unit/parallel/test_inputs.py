"""Bad input to cadenza.parallel and cadenza pretrain fails with one-line ConfigErrors, without any
process group (so it can never hang a collective); plus the pure pieces: chunking, schedules, packing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.errors import ConfigError
from cadenza.parallel import ParallelDims
from cadenza.parallel.context import ContextShare, gathered_positions, head_tail_positions, shard_sequence
from cadenza.parallel.parallelize import check_model
from cadenza.pretrain.data import PackedDataset, read_documents
from cadenza.pretrain.schedule import lr_at

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("kw", "world", "match"),
    [
        (dict(dp_shard=3), 8, "world size is 8"),
        (dict(cp=3), 8, "not divisible by dp_replicate·cp"),
        (dict(cp=2, ep=3), 8, "ep=3 must divide dp_shard·cp"),
        (dict(ep=16), 8, "ep=16 must divide"),
        (dict(dp_replicate=0), 8, "dp_replicate must be"),
        (dict(dp_shard=0), 8, "dp_shard must be"),
    ],
)
def test_dims_that_do_not_fit(kw: dict, world: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ParallelDims(**kw).resolve(world)


def test_dims_fill_and_derived_sizes() -> None:
    d = ParallelDims(dp_replicate=2, cp=2, ep=4).resolve(8)
    assert (d.dp_shard, d.dp_shard_cp, d.efsdp, d.dp) == (2, 4, 1, 4)
    assert [d.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [d.cp_rank(r) for r in range(8)] == [0, 1] * 4


def _tiny(kind: str):
    from tests.support.tiny_moe import tiny_model

    return tiny_model(kind)


def test_model_checks() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    moe = _tiny("qwen3_moe")
    with pytest.raises(ConfigError, match="ep=3 does not divide the number of experts"):
        check_model(moe, ParallelDims(ep=3).resolve(3))
    check_model(moe, ParallelDims(ep=4).resolve(4))
    dense = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    with pytest.raises(ConfigError, match="no routed-experts module"):
        check_model(dense, ParallelDims(ep=2).resolve(2))
    check_model(dense, ParallelDims(cp=2).resolve(2))  # dense models are fine without EP
    with pytest.raises(ConfigError, match="no decoder layer list"):
        check_model(torch.nn.Linear(2, 2), ParallelDims().resolve(1))


def test_head_tail_chunks_cover_the_sequence_and_balance_work() -> None:
    cp, seq = 4, 32
    parts = [head_tail_positions(seq, cp, r) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(seq))
    # causal work of a rank ~ sum of its query positions: identical on every rank
    assert len({int(p.sum()) for p in parts}) == 1
    assert torch.equal(gathered_positions(seq // cp, cp), torch.cat(parts))
    x = torch.arange(seq)[None]
    assert torch.equal(shard_sequence(x, cp, 1)[0], parts[1])
    with pytest.raises(ConfigError, match="not divisible by 2·cp = 8"):
        head_tail_positions(36, cp, 0)


def test_context_share_pads_any_length_after_the_real_tokens() -> None:
    """RL microbatches have any length: 13 tokens at cp = 2 become 16, the 3 pads at the end; the shares
    of the two ranks cover every real token once and keep pretraining's head–tail chunks."""
    x = torch.arange(1, 14)[None].expand(2, -1)  # [2, 13]
    shares = [ContextShare(group=None, size=2, rank=r) for r in range(2)]
    assert shares[0].padded_len(13) == 16 and shares[0].padded_len(16) == 16
    parts = [s.split(x, pad_value=0) for s in shares]
    assert [p.shape for p in parts] == [(2, 8), (2, 8)]
    assert torch.equal(parts[0][0], torch.tensor([1, 2, 3, 4, 13, 0, 0, 0]))
    assert sorted(torch.cat(parts, 1)[0].tolist()) == [0, 0, 0, *range(1, 14)]
    assert torch.equal(shares[1].positions(13), head_tail_positions(16, 2, 1))


def test_schedules() -> None:
    kw = dict(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(5, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(55, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(100, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(80, schedule="wsd", decay_fraction=0.2, **kw) == pytest.approx(1.0)
    assert lr_at(90, schedule="wsd", decay_fraction=0.2, **kw) == pytest.approx(0.55)
    assert lr_at(100, schedule="wsd", decay_fraction=0.2, **kw) == pytest.approx(0.1)


def test_packed_batches_do_not_depend_on_world_size() -> None:
    ds = PackedDataset(np.arange(200, dtype=np.int32), seq_len=8, seed=3)
    whole = ds.batch(7, 4, 0, 1)
    halves = torch.cat([ds.batch(7, 4, r, 2) for r in range(2)])
    assert torch.equal(whole, halves)
    assert all((row[1:] - row[:-1] == 1).all() for row in whole)  # contiguous blocks
    epoch = torch.cat([ds.batch(s, 5, 0, 1) for s in range(1, 6)])  # 25 blocks = one epoch
    assert sorted(int(r[0]) // 8 for r in epoch) == list(range(25))
    with pytest.raises(ConfigError, match="not divisible by the data-parallel degree 3"):
        ds.batch(1, 4, 0, 3)
    with pytest.raises(ConfigError, match="fewer than one sequence"):
        PackedDataset(np.arange(5, dtype=np.int32), seq_len=8)


def test_read_documents(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n"
    )
    (tmp_path / "b.txt").write_text("three")
    assert list(read_documents([str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")])) == [
        "one",
        "two",
        "three",
    ]
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ConfigError, match="no string field 'text'"):
        list(read_documents([str(tmp_path / "bad.jsonl")]))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        list(read_documents([str(tmp_path / "bin.txt")]))
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ConfigError, match="unsupported data file"):
        list(read_documents([str(tmp_path / "x.csv")]))


def test_pretrain_cli_bad_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "d.txt").write_text("hello")
    bad = {
        "typo.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n[train]\nsteps = 1\nlearning_rate = 1\n',
            "unknown config key 'train.learning_rate'",
        ),
        "nosection.toml": ('[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n', "is missing 'train'"),
        "nosteps.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n[train]\n',
            "[train] is missing 'steps'",
        ),
        "seq.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\nseq_len = 10\n[parallel]\ncp = 4\n'
            "[train]\nsteps = 1\n",
            "data.seq_len=10 is not divisible by 2·cp = 8",
        ),
        "nofile.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["gone.txt"]\n[train]\nsteps = 1\n',
            "does not exist",
        ),
        "opt.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n[train]\nsteps = 1\noptimizer = "sgd"\n',
            "unknown train.optimizer 'sgd'",
        ),
        "muon.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n[train]\nsteps = 1\noptimizer = "muon"\n'
            '[muon]\nadjust_lr = "spectral"\n',
            "muon.adjust_lr must be 'original' or 'match_rms_adamw'",
        ),
        "muon_key.toml": (
            '[model]\npath = "m"\n[data]\nfiles = ["d.txt"]\n[train]\nsteps = 1\n[muon]\nlr = 0.02\n',
            "unknown config key 'muon.lr'",
        ),
    }
    from cadenza.pretrain.config import load_config

    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path / name)
        assert message in str(err.value) and "\n" not in str(err.value)
    # and through the real CLI: exit 2, one line, no traceback
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", "pretrain", str(tmp_path / "seq.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: data.seq_len=10")
    assert "Traceback" not in proc.stderr
