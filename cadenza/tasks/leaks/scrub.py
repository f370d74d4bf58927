"""Make a task workspace and its environment leak-free before the scan gates it.

Every channel an agent could read the deleted code from is closed here: version-control history
(a fresh ``.git`` with one deterministic commit and no reflog), bytecode and tool caches, build
artefacts and packaging metadata, nested virtualenvs and repositories, ``.pyi`` stubs of removed
definitions, documentation lines that quote the removed source, and, in the task environment,
non-editable installs of the package, pip caches and archives that hold it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cadenza.errors import CadenzaError
from cadenza.tasks.leaks.scan import env_roots, read_content, scan_paths
from cadenza.tasks.leaks.secret import Secret, stub_definitions
from cadenza.tasks.sources.source import BUILD_DIRS, CACHE_DIRS

JUNK_FILES_SUFFIX = (".pyc", ".pyo", ".orig", ".rej")
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "cadenza",
    "GIT_AUTHOR_EMAIL": "tasks@cadenza.invalid",
    "GIT_COMMITTER_NAME": "cadenza",
    "GIT_COMMITTER_EMAIL": "tasks@cadenza.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
TEXT_DOC_SUFFIXES = (
    ".md",
    ".rst",
    ".txt",
    ".html",
    ".htm",
    ".ipynb",
    ".tex",
    ".adoc",
    ".org",
    ".cfg",
    ".toml",
    ".json",
    ".yaml",
    ".yml",
)


@dataclass
class ScrubReport:
    removed: list[str] = field(default_factory=list)
    edited: list[str] = field(default_factory=list)


def _is_junk_file(name: str) -> bool:
    return (
        name.endswith(JUNK_FILES_SUFFIX)
        or name == ".coverage"
        or name.startswith(".coverage.")
        or name in ("coverage.xml", ".git", ".gitmodules", "pip-log.txt")
    )


def _is_junk_dir(path: Path) -> bool:
    name = path.name
    if name in CACHE_DIRS or name.endswith((".egg-info", ".dist-info")) or name == ".git":
        return True
    if (path / "pyvenv.cfg").is_file():  # a virtualenv inside the repository
        return True
    return name in BUILD_DIRS and not (path / "__init__.py").exists()


def remove_junk(workspace: Path, report: ScrubReport) -> None:
    """Delete caches, bytecode, build outputs, metadata, nested repos and venvs (symlinks too)."""
    for dirpath, dirnames, filenames in os.walk(workspace, topdown=True):
        d = Path(dirpath)
        keep = []
        for name in dirnames:
            p = d / name
            if p.is_symlink():
                target = os.path.realpath(p)
                if not target.startswith(os.path.realpath(workspace) + os.sep):
                    p.unlink()  # a link out of the workspace reaches files we cannot vouch for
                    report.removed.append(str(p.relative_to(workspace)))
                continue
            if _is_junk_dir(p):
                shutil.rmtree(p)
                report.removed.append(str(p.relative_to(workspace)) + "/")
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            p = d / name
            outside = p.is_symlink() and not os.path.realpath(p).startswith(
                os.path.realpath(workspace) + os.sep
            )
            if _is_junk_file(name) or outside:
                p.unlink()
                report.removed.append(str(p.relative_to(workspace)))


def scrub_stubs(workspace: Path, secret: Secret, report: ScrubReport) -> None:
    """Remove ``.pyi`` definitions of names the task deleted (other stubs stay)."""
    for rel in secret.removed_files:  # a module deleted whole takes its stub with it
        stub = (workspace / rel).with_suffix(".pyi")
        if stub.is_file():
            stub.unlink()
            report.removed.append(str(stub.relative_to(workspace)))
    stems = {s for s, _ in secret.removed_names}
    for stub in workspace.rglob("*.pyi"):
        if stub.stem not in stems and stub.stem != "__init__":
            continue
        text = stub.read_text(errors="replace")
        spans = sorted(
            span
            for q, spans in stub_definitions(text).items()
            for span in spans
            if any(
                q == name and (s == stub.stem or stub.stem == "__init__") for s, name in secret.removed_names
            )
        )
        if not spans:
            continue
        lines = text.splitlines(keepends=True)
        drop = {i for start, end in spans for i in range(start - 1, end)}
        kept = "".join(ln for i, ln in enumerate(lines) if i not in drop)
        stub.write_text(kept)
        report.edited.append(str(stub.relative_to(workspace)))


def scrub_docs(workspace: Path, secret: Secret, report: ScrubReport) -> None:
    """Drop lines of non-Python text files that quote the deleted code."""
    for finding in scan_paths([(workspace, secret)]):
        path = Path(finding.path)
        if not path.is_file() or path.suffix == ".py" or "/.git/" in finding.path:
            continue
        data = path.read_bytes()
        if path.suffix not in TEXT_DOC_SUFFIXES and b"\x00" in data[:8192]:
            path.unlink()  # binary junk holding the code: nothing to keep
            report.removed.append(str(path.relative_to(workspace)))
            continue
        text = data.decode("utf-8", "replace")
        if path.suffix == ".ipynb":
            text = _scrub_notebook(text, secret)
        else:
            text = "".join(ln for ln in text.splitlines(keepends=True) if ln.strip() not in secret.candidates)
        path.write_text(text)
        report.edited.append(str(path.relative_to(workspace)))


def _scrub_notebook(text: str, secret: Secret) -> str:
    try:
        nb = json.loads(text)
        for cell in nb.get("cells", []):
            src = cell.get("source", [])
            src = src.splitlines(keepends=True) if isinstance(src, str) else src
            cell["source"] = [ln for ln in src if ln.strip() not in secret.candidates]
            cell.pop("outputs", None) if cell.get("cell_type") == "code" else None
        return json.dumps(nb, indent=1) + "\n"
    except (ValueError, AttributeError, TypeError):
        return "".join(ln for ln in text.splitlines(keepends=True) if ln.strip() not in secret.candidates)


def fresh_git(workspace: Path) -> None:
    """One commit of the current tree, fixed identity and date, no reflog, no hooks, no other objects."""
    git_dir = workspace / ".git"
    if git_dir.exists() or git_dir.is_symlink():
        shutil.rmtree(git_dir) if git_dir.is_dir() and not git_dir.is_symlink() else git_dir.unlink()
    env = {**os.environ, **GIT_IDENTITY}
    base = [
        "git",
        "-C",
        str(workspace),
        "-c",
        "init.defaultBranch=main",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "core.logAllRefUpdates=false",
        "-c",
        "gc.auto=0",
    ]
    try:
        for args in (
            ["init", "-q"],
            ["add", "-A"],
            ["commit", "-q", "--no-verify", "--allow-empty", "-m", "Task workspace"],
            ["config", "core.logAllRefUpdates", "false"],
            ["config", "gc.auto", "0"],
        ):
            subprocess.run(
                base + args, check=True, capture_output=True, env=env, timeout=300, stdin=subprocess.DEVNULL
            )
    except subprocess.CalledProcessError as exc:
        raise CadenzaError(
            f"git failed in {workspace}: {exc.stderr.decode(errors='replace').strip()[:200]}"
        ) from None
    except FileNotFoundError:
        raise CadenzaError("git is not installed; install it (apt-get install git) to build tasks") from None
    for leftover in ("logs", "hooks", "COMMIT_EDITMSG", "description", "ORIG_HEAD", "FETCH_HEAD"):
        p = git_dir / leftover
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def scrub_workspace(workspace: Path, secret: Secret) -> ScrubReport:
    """Close every workspace channel; the caller scans afterwards and rejects what is left."""
    workspace = Path(workspace)
    report = ScrubReport()
    remove_junk(workspace, report)
    if secret.removed_names or secret.removed_files:
        scrub_stubs(workspace, secret, report)
    scrub_docs(workspace, secret, report)
    fresh_git(workspace)
    return report


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def scrub_env(env_dir: Path, package: str, secret: Secret) -> ScrubReport:
    """Remove non-editable installs of ``package``, pip caches and files holding the code from ``env_dir``.

    Only files inside ``env_dir`` are touched; shared base environments reached through ``.pth``
    files are the scan's business (a leak there rejects the task).
    """
    env_dir = Path(env_dir)
    report = ScrubReport()
    if not env_dir.is_dir():
        return report
    for cache in [*env_dir.rglob("pip-cache"), *env_dir.rglob(".cache")]:
        if cache.is_dir():
            shutil.rmtree(cache)
            report.removed.append(str(cache))
    wanted = _normalise(package) if package else None
    for dist in env_dir.glob("lib*/python*/site-packages/*.dist-info"):
        name = _normalise(dist.name.rsplit("-", 1)[0]) if "-" in dist.name else _normalise(dist.stem)
        if wanted is None or name != wanted or _is_editable(dist) or not _records_files(dist):
            continue  # an editable install or a bare metadata dir holds no code
        site = dist.parent
        record = dist / "RECORD"
        if record.is_file():
            for line in record.read_text(errors="replace").splitlines():
                rel = line.split(",")[0]
                target = (site / rel).resolve()
                if rel and target.is_file() and str(target).startswith(str(env_dir.resolve())):
                    target.unlink()
        shutil.rmtree(dist)
        report.removed.append(str(dist))
    roots = [r for r in env_roots(env_dir) if str(r.resolve()).startswith(str(env_dir.resolve()))]
    for finding in scan_paths((r, secret) for r in roots):
        p = Path(finding.path)
        if p.is_file() and str(p.resolve()).startswith(str(env_dir.resolve())):
            p.unlink()
            report.removed.append(str(p))
    return report


def _records_files(dist: Path) -> bool:
    record = dist / "RECORD"
    if not record.is_file():
        return False
    return any(
        not ln.split(",")[0].startswith(dist.name)
        for ln in record.read_text(errors="replace").splitlines()
        if ln.strip()
    )


def _is_editable(dist: Path) -> bool:
    direct = dist / "direct_url.json"
    if not direct.is_file():
        return False
    try:
        return bool(json.loads(direct.read_text()).get("dir_info", {}).get("editable"))
    except ValueError:
        return False


__all__ = ["ScrubReport", "fresh_git", "read_content", "remove_junk", "scrub_env", "scrub_workspace"]
