"""Bubblewrap execution with rlimits, wall-clock timeouts and output capping."""

from cadenza.sandbox.binds import hidden_roots
from cadenza.sandbox.config import SandboxConfig
from cadenza.sandbox.envinfo import EnvInfo, env_info
from cadenza.sandbox.output import CappedBuffer, cap_text
from cadenza.sandbox.runner import ExecResult, Sandbox, bwrap_path

__all__ = [
    "CappedBuffer",
    "EnvInfo",
    "ExecResult",
    "Sandbox",
    "SandboxConfig",
    "bwrap_path",
    "cap_text",
    "env_info",
    "hidden_roots",
]
