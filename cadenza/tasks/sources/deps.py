"""Discover what a source needs installed to run its tests, without installing the source itself.

Runtime requirements come from static metadata (``PKG-INFO``, ``pyproject.toml [project]``,
``setup.cfg``) and, when those are dynamic, from pip's metadata report (built in a throwaway
isolated build, nothing cached). Test requirements come from test-like extras, dependency groups,
``requirements*test*.txt``, ``tox.ini [testenv] deps`` and ``setup.cfg`` extras / ``tests_require``.
Linters, type checkers, doc builders and coverage plugins are dropped: the grader never runs them
and they slow environment builds down.
"""

from __future__ import annotations

import ast
import configparser
import json
import re
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from cadenza.tasks.sources.isolate import run_pip
from cadenza.tasks.sources.source import copy_tree

TEST_EXTRAS = re.compile(r"^(tests?|testing|dev|develop|check|ci)([-_].*)?$", re.I)
#: Tools the test run never needs (and plugins whose addopts we neutralise instead).
DROPPED = {
    "pytest-cov",
    "coverage",
    "coveralls",
    "codecov",
    "pytest-mypy",
    "mypy",
    "pyright",
    "ruff",
    "flake8",
    "pytest-flake8",
    "pycodestyle",
    "pytest-pycodestyle",
    "pylint",
    "pytest-pylint",
    "black",
    "isort",
    "pre-commit",
    "tox",
    "nox",
    "twine",
    "build",
    "wheel",
    "sphinx",
    "pytest-xdist",
    "pytest-randomly",
    "pytest-sugar",
    "pytest-benchmark",
    "check-manifest",
    "bandit",
    "autopep8",
    "yapf",
    "pydocstyle",
    "pytest-rerunfailures",
    "pytest-memray",
    "codespell",
    "setuptools-scm",
    "pytest-instafail",
    "ipython",
    "ipdb",
    "pdbpp",
    "pytest-profiling",
    "pytest-watch",
    "pyupgrade",
    "doc8",
    "readme-renderer",
}
DROPPED_PREFIXES = ("sphinx", "types-", "flake8-", "mypy-", "furo", "mkdocs", "myst-", "pydata-sphinx")
#: Always present in a base environment: the runner, per-test timeouts, coverage for feature discovery.
TOOLING = ["pytest", "pytest-timeout", "coverage"]


@dataclass(kw_only=True)
class Requirements:
    """Requirement strings to install: ``runtime`` must succeed, ``test`` is best effort."""

    runtime: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def req_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""


def _keep(req: str, own: set[str]) -> bool:
    req = req.strip()
    if not req or req.startswith(("#", "-", ".", "/", "{", "git+", "http")):
        return False
    name = req_name(req)
    return bool(name) and name not in DROPPED and name not in own and not name.startswith(DROPPED_PREFIXES)


def _strip_extra_marker(req: str) -> str | None:
    """Drop an ``extra == "x"`` marker (the caller already chose the extra); None if it was the only one."""
    if ";" not in req:
        return req
    spec, marker = req.split(";", 1)
    cleaned = re.sub(r"""(and\s+)?extra\s*==\s*['"][^'"]+['"](\s+and)?""", "", marker).strip()
    return spec.strip() if not cleaned else f"{spec.strip()}; {cleaned}"


def split_requires(requires: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``Requires-Dist`` lines split into runtime requirements and ``{extra: requirements}``."""
    runtime: list[str] = []
    extras: dict[str, list[str]] = {}
    for req in requires:
        m = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", req)
        if m:
            stripped = _strip_extra_marker(req)
            if stripped:
                extras.setdefault(m.group(1), []).append(stripped)
        else:
            runtime.append(req)
    return runtime, extras


def _from_pkg_info(root: Path) -> tuple[list[str], dict[str, list[str]], bool] | None:
    path = root / "PKG-INFO"
    if not path.is_file():
        return None
    msg = Parser().parsestr(path.read_text(errors="replace"))
    version = tuple(int(x) for x in re.findall(r"\d+", msg.get("Metadata-Version", "1.0"))[:2])
    dynamic = {d.lower() for d in msg.get_all("Dynamic") or []}
    reliable = version >= (2, 2) and "requires-dist" not in dynamic
    return (*split_requires(msg.get_all("Requires-Dist") or []), reliable)


def _from_pyproject(root: Path) -> tuple[list[str] | None, dict[str, list[str]], dict[str, list[str]]]:
    """(static runtime deps or None when dynamic/absent, optional-dependencies, dependency-groups)."""
    path = root / "pyproject.toml"
    if not path.is_file():
        return None, {}, {}
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None, {}, {}
    project = data.get("project", {}) or {}
    deps = None
    if project and "dependencies" not in (project.get("dynamic") or []):
        deps = [str(d) for d in project.get("dependencies", []) or []]
    extras = {k: [str(x) for x in v] for k, v in (project.get("optional-dependencies") or {}).items()}
    groups_raw = data.get("dependency-groups", {}) or {}

    def expand(name: str, seen: set[str]) -> list[str]:
        out: list[str] = []
        if name in seen:
            return out
        seen.add(name)
        for item in groups_raw.get(name, []) or []:
            if isinstance(item, dict) and "include-group" in item:
                out += expand(str(item["include-group"]), seen)
            elif isinstance(item, str):
                out.append(item)
        return out

    groups = {k: expand(k, set()) for k in groups_raw}
    return deps, extras, groups


def _from_setup_cfg(root: Path) -> tuple[list[str] | None, dict[str, list[str]]]:
    path = root / "setup.cfg"
    if not path.is_file():
        return None, {}
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(path.read_text())
    except (configparser.Error, UnicodeDecodeError):
        return None, {}

    def lines(value: str) -> list[str]:
        return [ln.strip() for ln in value.splitlines() if ln.strip() and not ln.strip().startswith("#")]

    runtime = (
        lines(cp.get("options", "install_requires", fallback=""))
        if cp.has_option("options", "install_requires")
        else None
    )
    extras = (
        {k: lines(v) for k, v in cp.items("options.extras_require")}
        if cp.has_section("options.extras_require")
        else {}
    )
    if cp.has_option("options", "tests_require"):
        extras["tests_require"] = lines(cp.get("options", "tests_require"))
    return runtime, extras


def _read_requirements_file(path: Path, seen: set[Path]) -> list[str]:
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    out: list[str] = []
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            out += _read_requirements_file(path.parent / line.split(None, 1)[1], seen)
        elif line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def _from_tox(root: Path) -> list[str]:
    path = root / "tox.ini"
    if not path.is_file():
        return []
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cp.read_string(path.read_text())
    except (configparser.Error, UnicodeDecodeError):
        return []
    out: list[str] = []
    for section in ("testenv",):
        if not cp.has_option(section, "deps"):
            continue
        for raw in cp.get(section, "deps").splitlines():
            line = raw.strip()
            if line.startswith("-r"):
                out += _read_requirements_file(root / line[2:].strip().lstrip("=").strip(), set())
            elif line and not line.startswith(("#", "{")) and ":" not in line.split(" ")[0]:
                out.append(line)
    return out


def _pip_report(root: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Ask pip for the project's metadata (dynamic dependencies) without installing or caching anything.

    Building metadata runs the project's ``setup.py`` or build backend: in the sandbox, on a copy of the
    tree (an in-tree build writes ``*.egg-info`` next to the sources), with only that copy writable.
    """
    with tempfile.TemporaryDirectory(prefix="cadenza-meta-") as tmp:
        report, tree = Path(tmp) / "report.json", Path(tmp) / "src"
        copy_tree(root, tree)
        args = ["install", "--dry-run", "--no-deps", "--no-cache-dir", "-q", "--ignore-installed"]
        proc = run_pip([*args, "--report", str(report), str(tree)], workspace=Path(tmp), timeout_s=600)
        if proc.returncode != 0 or not report.is_file():
            return [], {}
        items = json.loads(report.read_text()).get("install", [])
    if not items:
        return [], {}
    return split_requires(items[0].get("metadata", {}).get("requires_dist", []) or [])


#: Evidence in test code (fixture argument, marker, import) -> the distribution that provides it.
PLUGIN_EVIDENCE = {
    "fixture:mocker": "pytest-mock",
    "fixture:requests_mock": "requests-mock",
    "fixture:httpx_mock": "pytest-httpx",
    "fixture:freezer": "pytest-freezer",
    "fixture:snapshot": "syrupy",
    "fixture:aioresponses": "aioresponses",
    "mark:asyncio": "pytest-asyncio",
    "mark:trio": "pytest-trio",
    "mark:freeze_time": "pytest-freezer",
    "mark:httpx_mock": "pytest-httpx",
    "import:hypothesis": "hypothesis",
    "import:yaml": "pyyaml",
    "import:pytest_mock": "pytest-mock",
    "import:freezegun": "freezegun",
    "import:responses": "responses",
    "import:mock": "mock",
    "import:attr": "attrs",
    "import:numpy": "numpy",
    "import:dateutil": "python-dateutil",
    "import:pytz": "pytz",
    "import:trustme": "trustme",
    "import:toml": "toml",
    "import:tomli": "tomli",
}


def parsed_files(root: Path, rels: Iterable[str]) -> Iterator[tuple[str, ast.Module]]:
    """(path, syntax tree) of the ``.py`` files among ``rels`` that parse."""
    for rel in rels:
        if not rel.endswith(".py"):
            continue
        try:
            yield rel, ast.parse((root / rel).read_text())
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue


def detect_plugins(root: Path, test_paths: list[str]) -> list[str]:
    """Distributions the test code visibly relies on (curated evidence only: never guesses names)."""
    found: list[str] = []
    for _, tree in parsed_files(root, test_paths):
        evidence: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                evidence.update(f"fixture:{a.arg}" for a in node.args.args)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"
            ):
                evidence.add(f"mark:{node.attr}")
            elif isinstance(node, ast.Import):
                evidence.update(f"import:{a.name.split('.')[0]}" for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                evidence.add(f"import:{node.module.split('.')[0]}")
        found += [PLUGIN_EVIDENCE[e] for e in sorted(evidence) if e in PLUGIN_EVIDENCE]
    return _dedupe(found)


def discover_requirements(
    root: Path, own_names: list[str], test_paths: list[str] | None = None
) -> Requirements:
    """Runtime + test requirements of the project at ``root`` (its own name(s) excluded)."""
    own = {re.sub(r"[-_.]+", "-", n).lower() for n in own_names}
    found = Requirements()
    runtime: list[str] | None = None
    extras: dict[str, list[str]] = {}
    pkg = _from_pkg_info(root)
    if pkg and pkg[2]:
        runtime, extras = pkg[0], dict(pkg[1])
        found.sources.append("PKG-INFO")
    py_deps, py_extras, groups = _from_pyproject(root)
    if runtime is None and py_deps is not None:
        runtime = py_deps
        found.sources.append("pyproject.toml")
    for k, v in py_extras.items():
        extras.setdefault(k, v)
    cfg_deps, cfg_extras = _from_setup_cfg(root)
    if runtime is None and cfg_deps is not None:
        runtime = cfg_deps
        found.sources.append("setup.cfg")
    for k, v in cfg_extras.items():
        extras.setdefault(k, v)
    has_setup_py = (root / "setup.py").is_file()
    if runtime is None and (has_setup_py or (root / "pyproject.toml").is_file()):
        runtime, pip_extras = _pip_report(root)
        for k, v in pip_extras.items():
            extras.setdefault(k, v)
        found.sources.append("pip metadata")
    test: list[str] = []
    for name, reqs in extras.items():
        if TEST_EXTRAS.match(name) or name == "tests_require":
            test += reqs
            found.sources.append(f"extra:{name}")
    for name, reqs in groups.items():
        if TEST_EXTRAS.match(name):
            test += reqs
            found.sources.append(f"group:{name}")
    for path in sorted(root.glob("requirements*")):
        if path.is_file() and "test" in path.name.lower():
            test += _read_requirements_file(path, set())
            found.sources.append(path.name)
    for path in sorted(root.glob("*/requirements*test*.txt")):
        test += _read_requirements_file(path, set())
        found.sources.append(path.relative_to(root).as_posix())
    tox = _from_tox(root)
    if tox:
        test += tox
        found.sources.append("tox.ini")
    plugins = detect_plugins(root, test_paths or [])
    if plugins:
        test += plugins
        found.sources.append("test code")
    # Self-references such as ``pkg[test]`` pull in the extra's requirements, which we already have.
    found.runtime = _dedupe([r for r in (runtime or []) if _keep(r, own)])
    found.test = _dedupe(
        [r for r in test if _keep(r, own) and req_name(r) not in {req_name(x) for x in found.runtime}]
    )
    return found


def _dedupe(reqs: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for r in reqs:
        key = req_name(r)
        if key not in seen:
            seen.add(key)
            out.append(r.strip())
    return out
