"""Fetching a source's files: a local git repository (a clean checkout of HEAD) or a PyPI sdist
(downloaded with pip, never through a cache, and unpacked safely)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

from cadenza.errors import SourceError
from cadenza.tasks.sources.isolate import run_pip
from cadenza.tasks.sources.source import IGNORED_DIRS, SDIST_SUFFIXES, SourceInfo, copy_tree, describe_source


def fetch_source(spec: str, dest: Path) -> SourceInfo:
    """Copy ``spec`` into ``dest`` (which must not exist yet) and describe it.

    ``spec`` is a local directory, a local git repository (the committed tree of ``HEAD`` is copied,
    never ``.git``), a local sdist archive, or ``pypi:NAME[==VERSION]`` (the sdist, downloaded with
    pip without any cache).
    Raises :class:`SourceError` for a nonexistent path, a tree with no tests, or a non-Python tree.
    """
    dest = Path(dest)
    if dest.exists():
        raise SourceError(f"destination {dest} already exists; pass an empty work directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if spec.startswith("pypi:"):
        _fetch_pypi(spec[len("pypi:") :].strip(), dest)
    else:
        src = Path(spec).expanduser()
        if not src.exists():
            raise SourceError(
                f"source {spec} does not exist; pass a directory, a git repository or pypi:NAME"
            )
        if src.is_file() and src.name.endswith(SDIST_SUFFIXES):
            _unpack(src, dest, f"source {spec}")
            return describe_source(spec, dest)
        if not src.is_dir():
            raise SourceError(
                f"source {spec} is not a directory or an sdist archive; pass a directory, a git repository, "
                "an sdist (.tar.gz/.zip) or pypi:NAME"
            )
        if (src / ".git").exists():
            _fetch_git(src, dest)
        else:
            copy_tree(src, dest)
    return describe_source(spec, dest)


def _fetch_git(src: Path, dest: Path) -> None:
    proc = subprocess.run(
        ["git", "-C", str(src), "archive", "--format=tar", "HEAD"], capture_output=True, timeout=300
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise SourceError(
            f"git source {src}: cannot read HEAD ({msg[-1] if msg else 'git archive failed'}); commit "
            "the tree first"
        )
    dest.mkdir()
    with tempfile.TemporaryFile() as fh:
        fh.write(proc.stdout)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="data")
    for p in list(dest.rglob("*")):
        if p.is_dir() and p.name in IGNORED_DIRS:
            shutil.rmtree(p, ignore_errors=True)


def _fetch_pypi(req: str, dest: Path) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\s*==\s*[A-Za-z0-9.+!_-]+)?", req):
        raise SourceError(
            f"pypi source '{req}' is not NAME or NAME==VERSION; write e.g. pypi:cachetools==5.3.3"
        )
    with tempfile.TemporaryDirectory(prefix="cadenza-sdist-") as tmp:
        files, reason = _pip_download(req.replace(" ", ""), Path(tmp))
        if not files:
            raise SourceError(f"pypi:{req}: cannot download an sdist ({reason}); check the name and version")
        _unpack(files[0], dest, f"pypi:{req}")


def _unpack(archive: Path, dest: Path, label: str) -> None:
    """Extract an sdist (``.tar.gz``/``.tgz``/``.tar.bz2``/``.zip``) safely; copy its single top dir to
    ``dest``."""
    with tempfile.TemporaryDirectory(prefix="cadenza-unpack-") as tmp:
        unpack = Path(tmp)
        if archive.name.endswith(".zip"):
            try:
                with zipfile.ZipFile(archive) as zf:
                    for member in zf.namelist():
                        if not (unpack / member).resolve().is_relative_to(unpack.resolve()):
                            raise SourceError(
                                f"{label}: archive has an unsafe path {member}; refusing to unpack it"
                            )
                    zf.extractall(unpack)
            except zipfile.BadZipFile as exc:
                raise SourceError(f"{label}: {archive.name} cannot be unpacked ({exc})") from None
        else:
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(unpack, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise SourceError(f"{label}: {archive.name} cannot be unpacked ({exc})") from None
        entries = list(unpack.iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpack
        copy_tree(top, dest)


def _pip_download(req: str, dest: Path) -> tuple[list[Path], str]:
    """Download the sdist of ``req`` into ``dest`` with pip, never through a cache.

    pip prepares the sdist's metadata before saving it; without build isolation that is seconds
    faster, so it is tried first (it works when this interpreter has the build backend) and the
    isolated build is the fallback. Only the package itself must be an sdist: ``--no-binary :all:``
    would also build its build backend from source, and that backend's, in nested isolated builds
    (``tinydb==4.9.0`` took minutes for poetry-core; its wheel takes seconds).
    """
    name = req.split("==")[0]
    base = ["download", "--no-binary", name, "--no-deps", "--no-cache-dir", "-q", "-d", str(dest), req]
    reason = "no sdist downloaded"
    for extra in (["--no-build-isolation"], []):
        # preparing the metadata runs the sdist's setup.py: in the sandbox, only ``dest`` writable
        proc = run_pip(base + extra, workspace=dest, timeout_s=600)
        if proc.returncode == -9:
            reason = "pip download timed out"
            continue
        files = [p for p in dest.iterdir() if p.is_file()]
        if proc.returncode == 0 and files:
            return files, ""
        errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
        reason = (
            errs[-1] if errs else reason
        )  # (a failed metadata build also reads "no matching distribution")
    return [], reason
