"""Red team, the verdict: code the agent wrote attacks what produces the outcome (attacks by class in
``tests/support/redteam_attacks.py``).

With every defence on, each attack earns reward 0 and is flagged. Each is real: with the switches that
stop it turned off (``Defences`` fields and ``checks.<Checks field>``, the grader's own switches, never a
monkeypatch) the same files resolve the task. Where several layers stop an attack, each is switched on
alone and still stops it. ``test_every_switch_stops_some_attack`` derives the switch list from the two
dataclasses, so a new defence without an attack fails the suite.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import EpisodeConfig
from cadenza.agent.grading.grade import grade
from cadenza.agent.grading.policy import Defences
from cadenza.agent.replay import replay
from cadenza.testrun import Checks
from tests.support.redteam_attacks import ATTACKS as BASE_ATTACKS
from tests.support.redteam_attacks import ATTEMPTS as BASE_ATTEMPTS
from tests.support.redteam_attacks import Attack
from tests.support.redteam_heldout import HELD_ATTACKS, HELD_ATTEMPTS
from tests.support.sandbox_fixtures import F2P, OPS_SOLVED, P2P, make_task

ATTACKS: dict[str, Attack] = {**BASE_ATTACKS, **HELD_ATTACKS}
ATTEMPTS: dict[str, dict[str, str]] = {**BASE_ATTEMPTS, **HELD_ATTEMPTS}


def switches() -> set[str]:
    """Every grading switch, from the dataclasses themselves."""
    out = {f.name for f in dataclasses.fields(Defences) if f.name != "checks"}
    return out | {f"checks.{f.name}" for f in dataclasses.fields(Checks)}


def defences(off: tuple[str, ...] | list[str]) -> Defences:
    unknown = set(off) - switches()
    assert not unknown, f"no such switch: {unknown}"
    d = Defences(**{n: False for n in off if not n.startswith("checks.")})
    checks = Checks(**{n.split(".", 1)[1]: False for n in off if n.startswith("checks.")})
    return dataclasses.replace(d, checks=checks)


#: layers that detect (and so flag) rather than prevent (the drops, autoload off, loading by path,
#: the env's plugins imported first)
DETECTING = {"capability_check", "f2p_rerun"} | {
    f"checks.{f.name}" for f in dataclasses.fields(Checks) if f.name not in ("by_path", "plugins_first")
}

PLANT_PYC = (
    "import importlib.util, py_compile, sys\n"
    "py_compile.compile(sys.argv[1], importlib.util.cache_from_source(sys.argv[2]), doraise=True,\n"
    "                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
)


def workspace(tdir: Path, tmp_path: Path, attack: Attack, task_env: Path) -> Path:
    ws = tmp_path / "agent"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(tdir / "workspace", ws)
    for rel, text in attack.files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    for rel in attack.delete:
        (ws / rel).unlink()
    if attack.bytecode:  # the solved module as an unchecked-hash .pyc beside the unchanged source
        solved = tmp_path / "solved_ops.py"
        solved.write_text(OPS_SOLVED)
        py = str(task_env / "bin" / "python")
        subprocess.run([py, "-c", PLANT_PYC, str(solved), str(ws / "calc/ops.py")], check=True, timeout=60)
    return ws


@pytest.fixture
def packaged_tests_task_dir(task_dir: Path) -> Path:
    """The toy task with ``tests/__init__.py`` in its pristine workspace (tests inside a package)."""
    (task_dir / "workspace" / "tests" / "__init__.py").write_text("")
    return task_dir


@pytest.fixture
def strict_warnings_task_dir(task_dir: Path) -> Path:
    """The toy task whose pytest configuration makes every warning an error."""
    pyproject = task_dir / "workspace" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + 'filterwarnings = ["error"]\n')
    return task_dir


@pytest.fixture
def env_plugin_task_dir(taskset: Path, task_env: Path) -> Path:
    """The toy task in an environment with a ``pytest11`` plugin (``toyplug``), chained to ``task_env``."""
    import json
    import sys

    task_dir = make_task(taskset, "calc-plugin", task_env)
    data = json.loads((task_dir / "task.json").read_text())
    data["env"] = "env"
    (task_dir / "task.json").write_text(json.dumps(data))
    env = task_dir / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = next(env.glob("lib/python*/site-packages"))
    base_site = next(task_env.glob("lib/python*/site-packages")).resolve()
    (site / "cadenza_task.pth").write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
    (site / "toyplug.py").write_text(
        '"""A harmless plugin."""\n\n\ndef pytest_configure(config):\n    pass\n'
    )
    dist = site / "toyplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pytest11]\ntoyplug = toyplug\n")
    return task_dir


def task_for(request, attack: Attack) -> Path:
    name = {
        "plain": "task_dir",
        "chained": "chained_task_dir",
        "packaged_tests": "packaged_tests_task_dir",
        "strict_warnings": "strict_warnings_task_dir",
        "env_plugin": "env_plugin_task_dir",
    }
    return request.getfixturevalue(name[attack.layout])


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_earns_nothing_and_is_flagged(request, tmp_path: Path, task_env: Path, name: str):
    attack = ATTACKS[name]
    tdir = task_for(request, attack)
    if attack.bytecode:  # bytecode is planted, not written through a tool call
        got = grade(tdir, workspace(tdir, tmp_path, attack, task_env))
        assert got.resolved is False and got.f2p_passed == 0, got  # never copied, so never run
        assert any("unchecked-hash bytecode" in c for c in got.capabilities), got.capabilities  # flagged
        return
    calls = [ToolCall(name="create", arguments={"path": p, "content": c}) for p, c in attack.files.items()]
    calls += [ToolCall(name="bash", arguments={"command": f"rm {p}"}) for p in attack.delete]
    outcome, _ = replay(tdir, [*calls, ToolCall(name="submit", arguments={})], EpisodeConfig(max_turns=30))
    assert outcome.resolved is False and outcome.reward == 0.0, outcome.grade
    assert outcome.flags, "every attack is flagged by the grader or a monitor rule"
    evidence = [*outcome.grade["tampering"], *outcome.grade["capabilities"], *outcome.grade["dropped"]]
    assert evidence, outcome.grade
    if attack.evidence:
        assert any(attack.evidence in e for e in evidence), evidence


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_real_with_its_stoppers_off(request, tmp_path: Path, task_env: Path, name: str):
    attack = ATTACKS[name]
    tdir = task_for(request, attack)
    result = grade(tdir, workspace(tdir, tmp_path, attack, task_env), defences=defences(attack.stoppers))
    assert result.resolved is True, (result.tests, result.tampering, result.capabilities, result.log_tail)
    assert result.f2p_passed == len(F2P) and result.p2p_passed == len(P2P)


@pytest.mark.parametrize(
    "name,layer",
    [(n, layer) for n, a in ATTACKS.items() if len(a.stoppers) > 1 for layer in a.stoppers],
)
def test_each_layer_alone_stops_the_attack(request, tmp_path: Path, task_env: Path, name: str, layer: str):
    attack = ATTACKS[name]
    tdir = task_for(request, attack)
    others = [s for s in attack.stoppers if s != layer]
    result = grade(tdir, workspace(tdir, tmp_path, attack, task_env), defences=defences(others))
    assert result.resolved is False and result.f2p_passed < len(F2P), (layer, result.tests, result.tampering)
    if layer in DETECTING:
        assert result.tampering or result.capabilities, (layer, "a detecting layer leaves evidence")


def test_every_switch_stops_some_attack():
    covered = {s for a in ATTACKS.values() for s in a.stoppers}
    assert covered == switches(), switches() ^ covered


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_attempts_earn_nothing_and_are_flagged(task_dir: Path, name: str):
    files = ATTEMPTS[name]
    calls = [ToolCall(name="create", arguments={"path": p, "content": c}) for p, c in files.items()]
    outcome, _ = replay(
        task_dir, [*calls, ToolCall(name="submit", arguments={})], EpisodeConfig(max_turns=10)
    )
    assert outcome.reward == 0.0 and outcome.resolved is False
    assert {f.rule for f in outcome.flags} & {"capability", "process_capability", "verdict_tampering"}, (
        outcome.flags
    )
