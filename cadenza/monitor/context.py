"""What the monitor's rules share: the :class:`Context` they read besides an event, path helpers,
:class:`Rule`."""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from cadenza.monitor.events import Event
from cadenza.tasks.records.task import Task


@dataclass
class Context:
    """What rules know besides the event: the task (if any) and what happened earlier."""

    packages: set[str] = field(default_factory=set)  # import/distribution names of the task's package
    protected: set[str] = field(default_factory=set)  # workspace-relative test files and pytest config
    feature_path: str = ""
    workspace: str = ""  # the episode's workspace path (trajectory.meta["workspace"]): never a system search
    seen_read: set[str] = field(default_factory=set)
    git_aliases: dict[str, str] = field(default_factory=dict)
    # capability kinds the task's pristine package already uses (trajectory.meta["package_capabilities"],
    # recorded by the episode): grading's capability check allows them in any kept file, and so does
    # the monitor
    package_capabilities: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls, task: Task | None, workspace: str = "", package_capabilities: frozenset[str] = frozenset()
    ) -> Context:
        ctx = cls(
            workspace=posixpath.normpath(workspace) if workspace else "",
            package_capabilities=frozenset(package_capabilities),
        )
        if task is None:
            return ctx
        names = {task.package, task.feature.qualname.split(".")[0]}
        first = [p for p in task.feature.path.split("/") if p not in ("src", "lib", "")]
        if len(first) > 1:
            names.add(first[0])
        for n in filter(None, names):
            ctx.packages.update({n.lower(), n.lower().replace("-", "_"), n.lower().replace("_", "-")})
        ctx.protected = {_rel(p) for p in task.test_files}
        for node in (*task.fail_to_pass, *task.pass_to_pass):
            ctx.protected.add(_rel(node.split("::", 1)[0]))
        ctx.feature_path = _rel(task.feature.path)
        return ctx

    @property
    def testing_package(self) -> bool:
        """The task's package is pytest, pluggy or a pytest plugin."""
        return any(p.startswith(("pytest", "_pytest", "pluggy")) for p in self.packages)

    def in_workspace(self, path: str) -> bool:
        if not self.workspace or not path.startswith("/"):
            return False
        path = posixpath.normpath(path)
        return path == self.workspace or path.startswith(self.workspace.rstrip("/") + "/")

    def observe(self, ev: Event) -> None:
        if ev.kind == "path" and ev.op in ("read", "list"):
            self.seen_read.add(ev.path)
        if ev.kind == "exec" and len(ev.argv) >= 4 and ev.argv[0] == "git" and ev.argv[1] == "config":
            keys = [a for a in ev.argv[2:] if not a.startswith("-")]
            if len(keys) >= 2 and keys[0].startswith("alias."):
                self.git_aliases[keys[0][6:]] = keys[1]


def _rel(path: str) -> str:
    path = path.strip()
    while path.startswith("./"):
        path = path[2:]
    return posixpath.normpath(path) if path else path


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _component_matches(component: str, names: set[str] | tuple[str, ...]) -> str | None:
    """The sensitive name ``component`` denotes, literally or as a glob with some literal text."""
    if component in names:
        return component
    if any(c in component for c in "*?[") and len(re.sub(r"[*?\[\]]", "", component)) >= 2:
        for n in names:
            if fnmatch.fnmatchcase(n, component):
                return n
    return None


def _suffix_matches(path: str, rel: str) -> bool:
    path = _rel(path)
    return path == rel or path.endswith("/" + rel)


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[Event, Context], str | None]
