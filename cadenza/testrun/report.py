"""One test run's verdict: exact pytest node IDs and their outcomes, plus evidence of tampering."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Outcomes a node can have; ``missing`` (never reported), ``tampered`` and ``blocked`` (not run: the
#: change failed the capability check) count as failures.
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "missing", "tampered", "blocked")


@dataclass(kw_only=True)
class TestReport:
    """Outcomes of one pytest run. ``outcomes`` maps node ID -> an entry of :data:`OUTCOMES`.

    ``tampering`` holds the evidence when the result channel or the runner was interfered with; then
    no node counts as passed. ``complete`` says the plugin's final record arrived.
    """

    __test__ = False  # not a pytest test class

    outcomes: dict[str, str]
    requested: list[str] | None
    exit_code: int
    timed_out: bool
    duration_s: float
    collect_errors: list[str] = field(default_factory=list)
    output_tail: str = ""
    tampering: list[str] = field(default_factory=list)
    complete: bool = True
    cpu_s: float = 0.0  # CPU seconds of the test process and its children, as it reported them

    def outcome(self, node_id: str) -> str:
        """The outcome of ``node_id``: ``"missing"`` when unreported, ``"tampered"`` for a tampered run."""
        if self.tampering:
            return "tampered"
        return self.outcomes.get(node_id, "missing")

    def passed(self, node_id: str) -> bool:
        return self.outcome(node_id) == "passed"

    def statuses(self, node_ids: list[str]) -> dict[str, str]:
        """``node_ids`` -> outcome (exactly those IDs, each once)."""
        return {n: self.outcome(n) for n in node_ids}

    @property
    def _ids(self) -> list[str]:
        return self.requested if self.requested is not None else list(self.outcomes)

    @property
    def passing(self) -> set[str]:
        return {n for n in self._ids if self.passed(n)}

    @property
    def not_passing(self) -> set[str]:
        """Requested (or reported) IDs that did not pass: failed, error, missing, skipped, xfail, tampered."""
        return {n for n in self._ids if not self.passed(n)}
