"""All hint generators behind one config: which kinds run, where hints go, and the placebo control."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cadenza.agent.trajectory import Trajectory
from cadenza.errors import ConfigError
from cadenza.feedback import critic as critic_mod
from cadenza.feedback import rules, style
from cadenza.feedback.hints import Hint
from cadenza.feedback.placement import check_placement

KINDS = ("tool_not_found", "invalid_arguments", "style", "repeated_failure", "critic")

PLACEBO_WORDS = (
    "Reminder:",
    "take",
    "a",
    "moment",
    "and",
    "then",
    "continue",
    "with",
    "the",
    "next",
    "step",
    "as",
    "planned.",
)


@dataclass(kw_only=True)
class FeedbackConfig:
    """``kinds``: generators to run, in order. ``placebo``: replace every hint by uninformative text of
    the same length (a control for "any extra context helps"). ``max_hints``: per trajectory, 0 = all."""

    # generators to run, in order (also: critic, an LLM behind an OpenAI-compatible endpoint)
    kinds: list[str] = field(
        default_factory=lambda: ["tool_not_found", "invalid_arguments", "style", "repeated_failure"]
    )
    placement: str = (
        "user_before_turn"  # where the teacher sees a hint: user_before_turn | append_to_observation
    )
    placebo: bool = False  # replace every hint by neutral text of the same length (a control)
    # tool hints name the env's decoy_tools() (another tool set) instead of its own: a control for the
    # hint's content (the same turns, the same kind of words, the wrong information)
    decoy: bool = False
    repeat_min: int = 2  # repeated_failure: same failing call and observation this many times
    style_select: list[str] = field(default_factory=lambda: list(style.DEFAULT_SELECT))  # ruff rule prefixes
    max_hints: int = 0  # per trajectory; 0 = all
    critic: critic_mod.CriticConfig = field(default_factory=critic_mod.CriticConfig)

    def validate(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise ConfigError(f"[feedback] unknown kinds {unknown}; known: {', '.join(KINDS)}")
        check_placement(self.placement)
        if self.placebo and self.decoy:
            raise ConfigError("[feedback] placebo and decoy are two controls; set at most one")
        if self.repeat_min < 2:
            raise ConfigError("[feedback] repeat_min must be >= 2")
        if self.max_hints < 0:
            raise ConfigError("[feedback] max_hints must be >= 0")
        if "critic" in self.kinds and not self.critic.base_url:
            raise ConfigError("[feedback] kind 'critic' needs [feedback.critic] base_url and model")
        self.critic.validate()


def placebo_text(text: str, length: Callable[[str], int] = len) -> str:
    """Neutral filler whose ``length`` (characters by default, or tokens) reaches that of ``text``."""
    target = length(text)
    words: list[str] = []
    i = 0
    while length(" ".join(words)) < target:
        words.append(PLACEBO_WORDS[i % len(PLACEBO_WORDS)])
        i += 1
    return " ".join(words)


def generate_hints(
    traj: Trajectory,
    tools: list[dict[str, Any]],
    config: FeedbackConfig,
    *,
    length: Callable[[str], int] = len,
    errors: list[str] | None = None,
) -> list[Hint]:
    """Hints for ``traj``, ordered by turn; at most one hint per (turn, kind)."""
    found: list[Hint] = []
    for kind in config.kinds:
        if kind == "tool_not_found":
            found += rules.tool_not_found(traj, tools)
        elif kind == "invalid_arguments":
            found += rules.invalid_arguments(traj, tools)
        elif kind == "repeated_failure":
            found += rules.repeated_failure(traj, config.repeat_min)
        elif kind == "style":
            found += style.style(traj, tuple(config.style_select))
        elif kind == "critic":
            found += critic_mod.critic(traj, config.critic, errors)
    seen: set[tuple[int, str]] = set()
    hints = []
    for h in sorted(found, key=lambda h: h.turn):
        if (h.turn, h.kind) in seen:
            continue
        seen.add((h.turn, h.kind))
        hints.append(
            Hint(turn=h.turn, text=placebo_text(h.text, length), kind=h.kind) if config.placebo else h
        )
    return hints[: config.max_hints] if config.max_hints else hints
