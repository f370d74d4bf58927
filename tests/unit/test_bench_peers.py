"""bench/peers.py's own logic: the shared reward and prompts, the summary's shape and arithmetic, the
missing-venv message, and one real cadenza step of its worker (TRL itself is never installed in CI)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
import peers_cadenza  # noqa: E402
from peers_common import (  # noqa: E402
    MARK,
    STEP_KEYS,
    Settings,
    compare,
    make_prompts,
    parse_line,
    summarise,
    vowel_reward,
)


def _row(step_s: float, tokens: int = 100, gen: float = 0.5) -> dict:
    return {"step_s": step_s, "generate_s": gen, "update_s": step_s - gen, "cpu_s": step_s,
            "completion_tokens": tokens, "prompt_tokens": 40, "reward": 0.5}  # fmt: skip


def test_the_reward_is_the_vowel_fraction() -> None:
    assert vowel_reward("") == 0.0
    assert vowel_reward("bcd") == 0.0
    assert vowel_reward("aEio") == 1.0
    assert vowel_reward("ab c") == 0.25


def test_prompts_are_fixed_by_seed_and_index() -> None:
    assert make_prompts(3, 0, 5) == make_prompts(3, 0, 5)
    assert make_prompts(6, 0, 5)[:3] == make_prompts(3, 0, 5)  # prompt i never depends on n
    assert make_prompts(3, 1, 5) != make_prompts(3, 0, 5)
    assert len(make_prompts(1, 0, 7)[0].split(": ", 1)[1].split()) == 7


def test_both_sides_take_the_same_prompts_in_the_same_order() -> None:
    source = peers_cadenza.make_source({"n": 8, "seed": 0, "words": 5})
    prompts = make_prompts(8, 0, 5)  # TRL's dataset, unshuffled: step s reads rows (s-1)*P .. s*P-1
    tasks = source.sample_tasks(None, 4, 4)  # the trainer's step 2 with 4 tasks per step
    assert [source.make_env(t).reset()[0]["content"] for t in tasks] == prompts[4:8]


def test_summary_drops_warmup_and_takes_medians() -> None:
    rows = [_row(9.0), _row(1.0, 100), _row(2.0, 100), _row(4.0, 200)]
    out = summarise(rows, warmup=1)
    assert out["step_s"] == [1.0, 2.0, 4.0]
    assert out["step_s_median"] == 2.0
    assert out["trained_tokens_per_s"] == 50.0  # median of 100, 50, 50
    assert out["completion_tokens_per_step"] == 100.0
    with pytest.raises(ValueError, match="no measured steps"):
        summarise(rows[:1], warmup=1)
    with pytest.raises(ValueError, match="step_s"):
        summarise([{"step_s": 1.0}], warmup=0)


def test_compare_says_who_is_faster() -> None:
    trl, cad = summarise([_row(3.0, gen=1.0)], 0), summarise([_row(2.0, gen=1.0)], 0)
    out = compare(trl, cad)
    assert out["speedup_step"] == 1.5 and out["speedup_generate"] == 1.0 and out["target_met"] is True
    assert compare(cad, trl)["target_met"] is False


def test_settings_round_trip_and_checks(tmp_path) -> None:
    s = Settings(model_dir="m", group_size=3, lr=1e-4)
    s.save(tmp_path / "s.json")
    assert Settings.load(tmp_path / "s.json") == s
    with pytest.raises(ValueError, match="--group-size"):
        Settings(group_size=1).check()
    assert parse_line(MARK + json.dumps({"a": 1})) == {"a": 1} and parse_line("{'a': 1}") is None


def test_a_missing_trl_venv_says_how_to_make_it(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"no TRL venv .*--install"):
        peers.trl_python(tmp_path / "nope")


def test_the_cadenza_worker_runs_a_real_step(tmp_path, monkeypatch) -> None:
    model = tmp_path / "model"
    peers.tiny_model(model, argparse.Namespace(seed=0, vocab=400, hidden=32, layers=1))
    s = Settings(model_dir=str(model), prompts_per_step=2, group_size=2, max_new_tokens=8, prompt_words=4,
                 steps=1, warmup=1)  # fmt: skip
    monkeypatch.setattr(sys.modules["__main__"], "make_source", peers_cadenza.make_source, raising=False)
    trainer = peers_cadenza.build_trainer(s, tmp_path / "run")
    try:
        rows = [peers_cadenza.run_step(trainer, k) for k in (1, 2)]
    finally:
        trainer.close()
    assert all(k in r for r in rows for k in STEP_KEYS)
    assert all(0 < r["completion_tokens"] <= 4 * 8 and r["step_s"] >= r["generate_s"] > 0 for r in rows)
    assert rows[0]["optimizer"] == "AdamW" and not rows[0]["skipped"]
