"""Which candidates a build tries, in which order, and the ids of the tasks they become: deterministic
for a seed, so builds with any number of workers publish the same task ids."""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter

from cadenza.tasks.deletion.baseline import Baseline
from cadenza.tasks.deletion.features import Candidate, FeatureMap
from cadenza.tasks.sources.source import SourceInfo

LEVEL_KINDS = {1: ("function", "method"), 2: ("function", "method"), 3: ("class", "module")}


def task_id(source: SourceInfo, qualname: str, level: int) -> str:
    """Deterministic id from the source (name, version, content) + qualname + level."""
    digest = hashlib.sha256(f"{source.name}|{source.content_hash}|{qualname}|{level}".encode()).hexdigest()[
        :8
    ]
    return (
        re.sub(r"[^A-Za-z0-9._-]+", "-", f"{source.name}-{source.version}__{qualname}__L{level}")
        + f"-{digest}"
    )


def order_candidates(
    fmap: FeatureMap,
    baseline: Baseline,
    levels: tuple[int, ...],
    seed: int,
    top_level: frozenset[str] = frozenset(),
) -> list[tuple[int, Candidate]]:
    """Candidates likely to validate, shuffled per level by ``seed`` and interleaved across levels.

    Pruned: no passing test covers it (nothing would fail), every passing test covers it (nothing
    would be left as PASS_TO_PASS), a package ``__init__`` module or a top-level single-module
    package (``top_level``: deleting it deletes the project), names defined twice.
    """
    n_pass = len(baseline.passing)
    per_level: dict[int, list[Candidate]] = {}
    names = Counter((c.path, c.local) for c in fmap.candidates)
    for level in levels:
        pool = []
        for c in fmap.candidates:
            if c.kind not in LEVEL_KINDS.get(level, ()) or not c.tests or len(c.tests) >= n_pass:
                continue
            if names[(c.path, c.local)] > 1 or (
                c.kind == "module" and (c.path.endswith("__init__.py") or c.module in top_level)
            ):
                continue
            pool.append(c)
        rng = random.Random(f"{seed}:{level}")
        pool.sort(key=lambda c: c.qualname)
        rng.shuffle(pool)
        per_level[level] = pool
    out: list[tuple[int, Candidate]] = []
    while any(per_level.values()):
        for level in levels:
            if per_level.get(level):
                out.append((level, per_level[level].pop(0)))
    return out


def candidate_key(qualname: str, level: int) -> tuple[str, int]:
    """What identifies a task of one source: the store's ``(qualname, level)`` (the id hashes the same)."""
    return (qualname, int(level))
