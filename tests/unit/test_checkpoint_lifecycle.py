"""The shared checkpoint lifecycle (cadenza/checkpoint.py): staging, atomic publish, listing, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadenza import checkpoint as ck
from cadenza.errors import CadenzaError


def _save(root: Path, step: int, keep: int = 2) -> Path:
    tmp = ck.staging(root, step)
    (tmp / "payload.bin").write_bytes(bytes([step]))
    return ck.publish(tmp, step, {"note": "x"}, keep=keep)


def test_publish_names_lists_and_prunes(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    paths = [_save(root, s) for s in (2, 10, 4)]
    assert paths[0].name == "step-00000002" and ck.read_meta(paths[1]) == {"note": "x", "step": 10}
    # keep=2 after each save: the newest two by step number (not by save order or name) survive
    assert [p.name for p in ck.list_checkpoints(root)] == ["step-00000004", "step-00000010"]
    assert ck.latest(root) == root / "step-00000010"
    assert not list(root.glob(".*.tmp"))  # nothing staged is left behind


def test_incomplete_and_foreign_directories_do_not_count(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save(root, 1)
    crashed = ck.staging(root, 7)  # a save killed before publish
    (crashed / "payload.bin").write_bytes(b"half")
    (root / "step-00000009").mkdir()  # DCP shards written, meta never written
    (root / "step-00000011").mkdir()
    (root / "step-00000011" / ck.META).write_text("{not json")
    (root / "notes").mkdir()
    assert ck.list_checkpoints(root) == [root / "step-00000001"]
    assert ck.staging(root, 7).is_dir() and not any(ck.staging(root, 7).iterdir())  # leftover cleared
    with pytest.raises(CadenzaError, match=r"not a complete cadenza checkpoint \(no meta.json\)"):
        ck.require_meta(root / "step-00000009")
    assert ck.latest(tmp_path / "absent") is None


def test_republishing_a_step_replaces_it(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _save(root, 3)
    tmp = ck.staging(root, 3)
    (tmp / "payload.bin").write_bytes(b"new")
    ck.publish(tmp, 3, {}, keep=5)
    assert (root / "step-00000003" / "payload.bin").read_bytes() == b"new"
