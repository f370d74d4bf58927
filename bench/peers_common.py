"""What both sides of ``bench/peers.py`` share: settings, prompts, the reward, the step protocol, the summary.

Standard library only: the TRL worker imports this from its own venv, which holds no cadenza. Each worker
reads the settings from a JSON file, announces ``ready``, then runs one training step per ``go`` line on
its stdin and answers with one JSON line on stdout prefixed by :data:`MARK` (everything else it prints,
TRL's logging included, is ignored). The parent sends ``go`` to one worker at a time, so the two never
compute at once.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARK = "PEERS "
_CONSONANTS = "bcdfghklmnprstvz"
_VOWELS = "aeiou"


@dataclass(kw_only=True)
class Settings:
    """The work both trainers do: identical prompts, group size, completion length, optimizer and threads."""

    model_dir: str = ""  # HF directory (model + tokenizer with a chat template) both sides load
    prompts_per_step: int = 4  # distinct prompts per step (GRPO groups)
    group_size: int = 4  # completions sampled per prompt
    max_new_tokens: int = 64  # completion length cap (both sides stop early only at the eos token)
    prompt_words: int = 24  # words per prompt (pseudo-words, see make_prompts)
    steps: int = 8  # measured steps per side
    warmup: int = 1  # leading steps per side that are run but not counted
    lr: float = 1e-5  # AdamW learning rate (constant: no schedule, no warm-up)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    grad_clip: float = 1.0  # global gradient-norm clip
    clip_eps: float = 0.2  # PPO ratio clip, both sides of 1
    temperature: float = 1.0  # sampling temperature (no top-k, no top-p)
    threads: int = 1  # torch intra-op threads in each worker
    seed: int = 0  # prompts, model init and sampling seeds

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Settings:
        data = json.loads(Path(path).read_text())
        data["betas"] = tuple(data["betas"])
        return cls(**data)

    def check(self) -> None:
        """One-line ``ValueError`` for settings that cannot describe a GRPO step."""
        for name in ("prompts_per_step", "max_new_tokens", "prompt_words", "steps", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(
                f"--group-size must be >= 2 (GRPO normalises within a group), got {self.group_size}"
            )
        if self.warmup < 0 or not self.lr > 0 or not self.temperature > 0:
            raise ValueError("--warmup must be >= 0, --lr and --temperature > 0")


def pseudo_word(rng: random.Random) -> str:
    """A pronounceable made-up word (so a locally trained BPE tokenizer finds real merges)."""
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 4)))


def corpus(seed: int, lines: int = 3000, words: int = 16) -> list[str]:
    """Text to train the tiny model's tokenizer on (deterministic under ``seed``)."""
    rng = random.Random(seed)
    return [" ".join(pseudo_word(rng) for _ in range(words)) for _ in range(lines)]


def make_prompts(n: int, seed: int, words: int) -> list[str]:
    """``n`` user prompts of ``words`` pseudo-words each; prompt ``i`` is the same for every ``n > i``."""
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/prompt/{i}")
        body = " ".join(pseudo_word(rng) for _ in range(words))
        out.append(f"Repeat these words, using as many vowels as you can: {body}")
    return out


def vowel_reward(text: str) -> float:
    """The single-turn reward: the fraction of the completion's characters that are ASCII vowels.

    Deterministic, cheap, and varied across samples of a random model (so no group has zero variance)."""
    if not text:
        return 0.0
    return sum(c in "aeiouAEIOU" for c in text) / len(text)


def emit(obj: dict[str, Any]) -> None:
    """One protocol line on stdout."""
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def wait_go() -> bool:
    """Block until the parent says ``go`` (True) or closes stdin / says anything else (False)."""
    return sys.stdin.readline().strip() == "go"


def parse_line(line: str) -> dict[str, Any] | None:
    """The protocol object on ``line``, or None for any other output."""
    return json.loads(line[len(MARK) :]) if line.startswith(MARK) else None


STEP_KEYS = ("step_s", "generate_s", "update_s", "cpu_s", "completion_tokens", "prompt_tokens", "reward")


def summarise(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One side's figures over its measured steps (the first ``warmup`` rows are dropped): medians of the
    step, generation and update seconds, the tokens per step, and trained (completion) tokens per second
    as the median of the per-step rates."""
    if any(k not in r for r in rows for k in STEP_KEYS):
        raise ValueError(f"every step row needs {', '.join(STEP_KEYS)}")
    kept = rows[warmup:]
    if not kept:
        raise ValueError(f"no measured steps: {len(rows)} rows, {warmup} warm-up")

    def med(key: str) -> float:
        return round(statistics.median(float(r[key]) for r in kept), 4)

    rates = [r["completion_tokens"] / r["step_s"] for r in kept]
    return {
        "step_s_median": med("step_s"),
        "generate_s_median": med("generate_s"),
        "update_s_median": med("update_s"),
        "step_cpu_s_median": med("cpu_s"),
        "completion_tokens_per_step": med("completion_tokens"),
        "prompt_tokens_per_step": med("prompt_tokens"),
        "trained_tokens_per_s": round(statistics.median(rates), 1),
        "generated_tokens_per_generate_s": round(
            statistics.median(r["completion_tokens"] / r["generate_s"] for r in kept), 1
        ),
        "reward_mean": round(statistics.fmean(float(r["reward"]) for r in kept), 4),
        "step_s": [round(float(r["step_s"]), 4) for r in kept],
    }


def compare(trl: dict[str, Any], cadenza: dict[str, Any]) -> dict[str, Any]:
    """Ratios of TRL's time to cadenza's (> 1: cadenza is faster) and whether cadenza meets the target
    (a step at least as fast as TRL's on the same work)."""

    def ratio(key: str) -> float:
        return round(trl[key] / cadenza[key], 3) if cadenza[key] else float("nan")

    return {
        "speedup_step": ratio("step_s_median"),
        "speedup_generate": ratio("generate_s_median"),
        "speedup_update": ratio("update_s_median"),
        "speedup_step_cpu": ratio("step_cpu_s_median"),
        "target": "cadenza step_s_median <= trl step_s_median",
        "target_met": cadenza["step_s_median"] <= trl["step_s_median"],
    }
