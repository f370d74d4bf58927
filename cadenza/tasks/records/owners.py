"""Who owns a staging or work directory: ``pid@host`` tags and whether that owner may still run."""

from __future__ import annotations

import os
import socket


def owner_tag() -> str:
    """``pid@host`` of this process: names of staging and work dirs, which may sit on a filesystem
    shared by several machines (a Ray build), where a bare pid says nothing."""
    return f"{os.getpid()}@{socket.gethostname().replace('.', '_')}"


def owner_alive(tag: str) -> bool:
    """Whether the owner ``tag`` (see :func:`owner_tag`; a bare pid = this host) may still run.

    Owners on another host are assumed alive: their directories are theirs to clean up."""
    pid, _, host = tag.partition("@")
    if not pid.isdigit():
        return False
    if host and host != socket.gethostname().replace(".", "_"):
        return True
    return pid_alive(int(pid))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (owners of staging and work dirs)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
