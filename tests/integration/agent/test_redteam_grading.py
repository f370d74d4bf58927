"""Red team, grading channels: each attack is replayed as tool calls and must be useless at grading.

(Attacks through pytest configuration, ``addopts``, start-up hooks and the runner's own machinery,
each with its defences switched off to prove it real, are in ``test_redteam_verdict.py``.)

Where the attack fools pytest in the agent's own workspace, the test first shows that (``run_tests``
reports the clamp tests passing), then that grading on a fresh copy does not resolve the task.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cadenza.agent.env import ToolCall
from cadenza.agent.episode import EpisodeConfig
from cadenza.agent.replay import patch_actions, replay
from tests.support.sandbox_fixtures import GOLD_PATCH

PASS_ALL_HOOK = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""

FAKE_PYTEST = """import sys
print("FAKE PYTEST")
ids = [a for a in sys.argv[1:] if "::" in a]
out = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml=")), None)
if out:
    cases = []
    for nid in ids:
        path, _, rest = nid.partition("::")
        parts = [path[:-3].replace("/", ".")] + rest.split("::")
        cases.append('<testcase classname="%s" name="%s"/>' % (".".join(parts[:-1]), parts[-1]))
    open(out, "w").write("<testsuites><testsuite>%s</testsuite></testsuites>" % "".join(cases))
print("%d passed" % (len(ids) or 6))  # what the restored tests/test_ops.py would show
"""

# Plants pytest's own assertion-rewrite cache for tests/test_ops.py: a compiled module whose tests all
# pass, stamped with the real source's mtime and size so that pytest loads it instead of the source.
FAKE_REWRITE_CACHE = r'''import importlib.util, inspect, marshal, os, struct, sys, pytest
src = "tests/test_ops.py"
fake = """import pytest
def test_add(): pass
def test_mul(): pass
def test_clamp_inside(): pass
@pytest.mark.parametrize("x,expected", [(-3, 0), (42, 10)], ids=["low", "high"])
def test_clamp_bounds(x, expected): pass
class TestClamp:
    def test_bad_interval(self): pass
"""
st = os.stat(src)
code = compile(fake, os.path.abspath(src), "exec")
os.makedirs("tests/__pycache__", exist_ok=True)
name = "tests/__pycache__/test_ops.%s-pytest-%s.pyc" % (sys.implementation.cache_tag, pytest.__version__)
from _pytest.assertion import rewrite
with open(name, "wb") as fh:
    if "source_hash" in inspect.getsource(rewrite._read_pyc):  # hash-checked caches (newer pytest)
        fh.write(importlib.util.MAGIC_NUMBER + b"\x03\0\0\0")
        fh.write(importlib.util.source_hash(open(src, "rb").read()))
    else:  # mtime + size stamped caches
        fh.write(importlib.util.MAGIC_NUMBER + b"\0\0\0\0")
        fh.write(struct.pack("<LL", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF))
    fh.write(marshal.dumps(code))
print("planted", name)
'''


def act(tool: str, **args) -> dict:
    return {"tool": tool, "args": args}


ATTACKS: dict[str, tuple[list[dict], str, bool]] = {
    # name: (actions, reason the change is dropped, whether the attack fools the agent's own run_tests)
    "rewrite_tests": (
        [act("create", path="tests/test_ops.py", content="def test_clamp_inside():\n    assert True\n")],
        "test file",
        False,
    ),
    "delete_tests": ([act("bash", command="rm -rf tests")], "deletion of test file", False),
    "root_conftest": ([act("create", path="conftest.py", content=PASS_ALL_HOOK)], "conftest.py", True),
    "nested_conftest": (
        [act("create", path="tests/conftest.py", content=PASS_ALL_HOOK)],
        "conftest.py",
        True,
    ),
    "shadow_pytest_module": ([act("create", path="pytest.py", content=FAKE_PYTEST)], "shadow", True),
    "pytest_rewrite_cache": (
        [act("create", path="plant.py", content=FAKE_REWRITE_CACHE), act("bash", command="python plant.py")],
        "",
        True,
    ),
    "injected_skip": (
        [
            act(
                "str_replace",
                path="calc/ops.py",
                old="def mul(a, b):",
                new="def clamp(*args):\n    import pytest\n    pytest.skip('later')\n\n\ndef mul(a, b):",
            )
        ],
        "",
        False,
    ),
    "exit_before_report": (
        [
            act(
                "str_replace",
                path="calc/__init__.py",
                old='"""A tiny calculator."""',
                new='"""A tiny calculator."""\nimport os\nos._exit(0)',
            )
        ],
        "",
        False,
    ),
}


def _run(task_dir: Path, actions: list[dict], *, run_tests: bool = False):
    calls = [ToolCall(name=a["tool"], arguments=a["args"]) for a in actions]
    if run_tests:
        calls.append(ToolCall(name="run_tests", arguments={"selector": "tests/test_ops.py"}))
    calls.append(ToolCall(name="submit", arguments={}))
    return replay(task_dir, calls, EpisodeConfig(max_turns=50))


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_useless_at_grading(task_dir: Path, name: str):
    actions, reason, fools_agent_run = ATTACKS[name]
    outcome, traj = _run(task_dir, actions, run_tests=fools_agent_run)
    if fools_agent_run:
        agent_run = traj.messages[-3]["content"]  # the run_tests observation
        assert "failed" not in agent_run and "6 passed" in agent_run, agent_run  # every test of the file
    assert outcome.resolved is False and outcome.reward == 0.0
    assert outcome.f2p[0] == 0
    dropped = outcome.grade["dropped"]
    if reason:
        assert any(reason in why for why in dropped.values()), dropped
    if outcome.grade["capabilities"]:  # refused before it ran (the capability check)
        assert set(outcome.grade["tests"].values()) == {"blocked"}
    elif name != "exit_before_report":
        assert outcome.p2p == (3, 3)  # restored tests still run and pass


@pytest.mark.parametrize("name", ["root_conftest", "delete_tests", "shadow_pytest_module"])
def test_dropping_attacks_keeps_a_real_solution(task_dir: Path, name: str):
    actions, _, _ = ATTACKS[name]
    outcome, _ = _run(task_dir, patch_actions(GOLD_PATCH) + actions)
    assert outcome.resolved is True and outcome.f2p[0] == 4
    assert "calc/ops.py" in outcome.grade["applied"]


def test_missing_node_counts_as_failed(task_dir: Path):
    actions, _, _ = ATTACKS["exit_before_report"]
    outcome, _ = _run(task_dir, patch_actions(GOLD_PATCH) + actions)
    assert outcome.resolved is False and outcome.reward == 0.0
    # an exit the original code never makes is refused before the run; the exit itself (status 0 without
    # the runner's final record) is the end_record check's, in test_redteam_verdict.py (forge_without_end)
    assert set(outcome.grade["tests"].values()) == {"blocked"}
    assert any("process exits" in c for c in outcome.grade["capabilities"])
    assert any(f.rule == "capability" for f in outcome.flags)


def test_gold_patch_as_tool_calls_resolves_without_flags(task_dir: Path):
    actions = patch_actions((task_dir / "gold.patch").read_text())
    assert {a["tool"] for a in actions} <= {"create", "str_replace"}
    outcome, traj = _run(task_dir, actions)
    assert outcome.resolved is True and outcome.reward == 1.0
    assert outcome.f2p == (4, 4) and outcome.p2p == (3, 3)
    assert outcome.flags == [] and traj.flags == []
    assert all(t.error_kind is None for t in traj.turns)
    assert traj.outcome == outcome.to_dict() and "+    return max(lo, min(x, hi))" in traj.meta["submission"]


def test_unknown_node_id_is_missing_and_does_not_hide_the_others(task_dir: Path, tmp_path: Path):
    import json
    import shutil
    import subprocess

    from cadenza.agent.grading.grade import grade

    data = json.loads((task_dir / "task.json").read_text())
    data["pass_to_pass"].append("tests/test_ops.py::test_gone[renamed]")
    (task_dir / "task.json").write_text(json.dumps(data))
    solved = tmp_path / "solved"
    shutil.copytree(task_dir / "workspace", solved)
    subprocess.run(["git", "apply", str(task_dir / "gold.patch")], cwd=solved, check=True)
    result = grade(task_dir, solved)
    assert result.tests["tests/test_ops.py::test_gone[renamed]"] == "missing"
    assert result.f2p_passed == 4 and result.p2p_passed == 3 and result.p2p_total == 4
    assert result.resolved is False


def test_a_write_through_a_symlinked_directory_of_the_pristine_workspace_is_refused(tmp_path: Path):
    """``_copy_inside``: the graded copy holds ``data -> OUTSIDE`` (a symlinked directory of the
    pristine workspace). A kept file under it must not be written through the link (it would land
    outside the workspace); a file beside it still is. And the whole path through ``apply_changes``:
    the agent replaces the link by a real directory holding a file, which lands inside."""
    from cadenza.agent.grading.grade import _copy_inside, apply_changes
    from cadenza.agent.grading.policy import GradePolicy

    outside = tmp_path / "outside"
    outside.mkdir()
    pristine, agent, dest = tmp_path / "pristine", tmp_path / "agent", tmp_path / "dest"
    for root in (pristine, dest):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "data").symlink_to(outside, target_is_directory=True)
    assert _copy_inside(dest, "data/evil.py", b"X = 1\n") is False
    assert _copy_inside(dest, "data/sub/evil.py", b"X = 1\n") is False
    assert _copy_inside(dest, "pkg/ok.py", b"X = 1\n") is True
    assert list(outside.iterdir()) == [], "a write went through the symlink"
    (agent / "pkg").mkdir(parents=True)
    (agent / "pkg" / "__init__.py").write_text("")
    (agent / "data").mkdir()
    (agent / "data" / "evil.py").write_text("X = 1\n")
    policy = GradePolicy(test_paths=frozenset(), shadowable=frozenset(), pristine_top=frozenset({"pkg"}))
    apply_changes(pristine, agent, dest, policy)
    assert list(outside.iterdir()) == [], "a write went through the symlink"
