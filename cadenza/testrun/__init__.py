"""The one test runner: validation, ``tasks verify`` and grading all get their verdict from here."""

from cadenza.testrun.channel import Checks
from cadenza.testrun.report import OUTCOMES, TestReport
from cadenza.testrun.run import CommandExecutor, HostExecutor, SandboxExecutor, env_plugins, run_tests

__all__ = [
    "OUTCOMES",
    "Checks",
    "CommandExecutor",
    "HostExecutor",
    "SandboxExecutor",
    "TestReport",
    "env_plugins",
    "run_tests",
]
