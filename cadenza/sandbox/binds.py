"""The read-only allowlist: which host paths a sandboxed command may see.

Never ``/`` as a whole: system directories, the task environment, its base interpreter and the
directories its ``sys.path`` reaches. A path is never bound if it is inside, or an ancestor of, a
hidden root (the task set, the host home), so ``gold.patch`` and other tasks stay invisible.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cadenza.errors import SandboxError
from cadenza.pathrel import is_within
from cadenza.sandbox.envinfo import EnvInfo

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@dataclass(kw_only=True)
class BindPlan:
    symlinks: list[tuple[str, str]] = field(default_factory=list)  # (target, link path)
    ro: list[str] = field(default_factory=list)
    rw: list[str] = field(default_factory=list)
    pythonpath: list[str] = field(default_factory=list)  # env sys.path entries mapped into the workspace


def hidden_roots(task_dir: os.PathLike[str] | str) -> list[Path]:
    """What a sandbox for a task must never show: the task directory and the task set holding it.

    The parent is left out when it is ``/``, the home directory or the temp directory (or above it):
    that is not a task set, and workspace copies live under the temp directory.
    """
    task_dir = Path(os.path.realpath(task_dir))
    roots = [task_dir]
    parent = task_dir.parent
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    home = Path(os.path.realpath(os.path.expanduser("~")))
    if parent != Path(parent.anchor) and parent != home and not tmp.is_relative_to(parent):
        roots.append(parent)
    return roots


TASK_MARKERS = ("task.json", "gold.patch")


def _inside_a_task(path: str, hidden: list[str]) -> bool:
    """Whether ``path`` lies in a hidden root within a task directory (one holding task.json or gold.patch).

    A shared environment kept inside the task set (``taskset/.envs/...``) may be bound; anything in
    this task's or another task's directory may not.
    """
    for root in hidden:
        if not is_within(path, root):
            continue
        probe = Path(path)
        while True:
            if any((probe / marker).exists() for marker in TASK_MARKERS):
                return True
            if str(probe) == root or probe == probe.parent:
                break
            probe = probe.parent
    return False


def _is_site_dir(path: str) -> bool:
    """Inside an environment's package directory (where ``sys.path`` legitimately reaches in a home)."""
    return any(part in ("site-packages", "dist-packages") for part in path.split(os.sep))


def _link_targets(directory: str) -> list[str]:
    """Real paths of the symlinks directly inside ``directory`` (a site-packages of linked packages)."""
    try:
        entries = [e for e in os.scandir(directory) if e.is_symlink()]
    except OSError:
        return []
    return [t for t in (os.path.realpath(e.path) for e in entries) if os.path.exists(t)]


def plan_binds(
    *,
    workspace: Path,
    env: EnvInfo | None,
    hidden: list[Path],
    path_map: dict[Path, Path] | None = None,
    rw_extra: list[Path] | None = None,
    ro_extra: list[str] | None = None,
) -> BindPlan:
    """Compute binds. ``path_map`` maps a pristine directory (e.g. the task's ``workspace/``) to the copy
    the sandbox sees, so env ``sys.path`` entries pointing into the pristine tree follow the copy."""
    plan = BindPlan()
    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            plan.symlinks.append((os.readlink(p), p))
        elif os.path.isdir(p):
            plan.ro.append(p)
    home = os.path.realpath(os.path.expanduser("~"))
    hidden_real = [os.path.realpath(h) for h in hidden]
    rw = [os.path.realpath(workspace), *(os.path.realpath(p) for p in (rw_extra or []))]
    mapped = {os.path.realpath(k): os.path.realpath(v) for k, v in (path_map or {}).items()}

    protected = [*hidden_real, home]

    def exposes(path: str) -> str | None:
        """The protected root that binding ``path`` would reveal (path is that root or an ancestor)."""
        return next((h for h in protected if is_within(h, path)), None)

    explicit: list[str] = []
    if env is not None:
        explicit += [env.base_prefix, env.base_exec_prefix, env.env_dir, os.path.realpath(env.env_dir)]
    explicit += list(ro_extra or [])
    for p in explicit:
        rp = os.path.realpath(p)
        clash = exposes(rp)
        if clash is not None:
            raise SandboxError(
                f"read-only bind {p} would expose {clash} inside the sandbox; keep task environments and "
                "interpreters in their own directories, not at the root of a task set or home directory"
            )
        for target in dict.fromkeys((p, rp)):
            if target not in plan.ro and os.path.exists(target):
                plan.ro.append(target)
    if env is not None:
        covered = [*plan.ro]
        for entry in env.sys_path:
            rp = os.path.realpath(entry)
            if not os.path.isdir(rp) or any(is_within(rp, r) for r in rw):
                continue
            target = next((v + rp[len(k) :] for k, v in mapped.items() if is_within(rp, k)), None)
            if target is not None:
                plan.pythonpath.append(target)
                continue
            if any(is_within(rp, c) for c in covered) or exposes(rp) or _inside_a_task(rp, hidden_real):
                continue
            if is_within(rp, home) and not _is_site_dir(rp):
                continue  # a .pth line of some package pointing into the home directory (~/.ssh)
            plan.ro.append(rp)
            covered.append(rp)
        # a site directory may link packages from elsewhere (``pkg -> /other/site-packages/pkg``):
        # their targets are part of the environment too
        site_dirs = [os.path.realpath(e) for e in env.sys_path if os.path.isdir(e)]
        for root in dict.fromkeys(d for d in site_dirs if not any(is_within(d, r) for r in rw)):
            for target in _link_targets(root):
                if target.startswith(("/proc/", "/sys/", "/dev/")):
                    continue
                if any(is_within(target, c) for c in covered) or any(is_within(target, r) for r in rw):
                    continue
                if exposes(target) or _inside_a_task(target, hidden_real):
                    continue
                plan.ro.append(target)
                covered.append(target)
    plan.rw = rw
    return plan
