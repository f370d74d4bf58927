"""Several rollout engines as one: least-loaded placement of new sessions, affinity for the rest.

An episode's prompt at turn ``t + 1`` extends its prompt at turn ``t`` token for token (token-in /
token-out), so the first prompt of a session (its *root*: system + task + generation prompt) is a
prefix of every later one. The router remembers roots; a prompt whose prefix is a known root goes
to that root's engine (its KV prefix cache is warm there, and the G samples of a GRPO group share
one root), any other prompt starts a session on the engine with the fewest sessions. Load is what
this router placed: with many rollout workers each balances its own sessions.

Seeds are drawn per prompt before the split, as a lone engine draws them, so a prompt samples the
same whichever engine serves it. Weight syncs stream one pass over the tensors to every engine at once
(a bounded queue per engine), so a model is never held in memory twice.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from cadenza.errors import CadenzaError
from cadenza.rl.engines.openai import request_seeds
from cadenza.rl.engines.policy import Sample, SampleRequest

_END = object()


class Router:
    name = "router"

    def __init__(self, engines: Sequence[Any], *, max_sessions: int = 4096, queue_depth: int = 4) -> None:
        if not engines:
            raise CadenzaError("the router needs at least one engine")
        self.engines = list(engines)
        self.max_sessions = max_sessions
        self.queue_depth = queue_depth
        self._roots: OrderedDict[tuple[int, int], int] = OrderedDict()  # (length, hash) -> engine index
        self._lengths: dict[int, int] = {}  # root length -> how many roots have it
        self.sessions = [0] * len(self.engines)
        self.served = [0] * len(self.engines)  # prompts sent to each engine
        self._pool = ThreadPoolExecutor(max_workers=len(self.engines), thread_name_prefix="cadenza-router")
        self._lock = threading.Lock()  # the per-episode loop calls sample from several threads at once
        # where new sessions go when set: a driver that sees every actor's load decides it per unit
        # (RayWorkers), so actors with their own routers do not all pick the same engine
        self.prefer: int | None = None

    @property
    def version(self) -> int:
        return min(int(e.version) for e in self.engines)

    @property
    def fixed_batches(self) -> bool:
        """Whether any engine's samples move with the batch (then the rollout fixes its batches)."""
        return any(getattr(e, "fixed_batches", False) for e in self.engines)

    def route(self, prompt: Sequence[int]) -> int:
        """The engine for ``prompt``: its session's, or the least-loaded one for a new session."""
        for length in sorted(self._lengths, reverse=True):
            if length <= len(prompt):
                key = (length, hash(tuple(prompt[:length])))
                if key in self._roots:
                    self._roots.move_to_end(key)
                    return self._roots[key]
        index = self.prefer
        if index is None or not 0 <= index < len(self.engines):
            index = min(range(len(self.engines)), key=lambda i: (self.sessions[i], i))
        key = (len(prompt), hash(tuple(prompt)))
        self._roots[key] = index
        self._lengths[len(prompt)] = self._lengths.get(len(prompt), 0) + 1
        self.sessions[index] += 1
        while len(self._roots) > self.max_sessions:  # forget the least recently used session
            (length, _), old = self._roots.popitem(last=False)
            self.sessions[old] -= 1
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]
        return index

    def sample(self, request: SampleRequest) -> list[Sample]:
        prompts = request.prompts
        with self._lock:
            routes = [self.route(p) for p in prompts]
        # One seed per prompt, drawn before the split exactly as one engine draws them: a served engine
        # samples a prompt the same whichever engine it went to (and as a lone engine would). Engines
        # that sample from a generator (``hf``) get one seeded by their first prompt's seed.
        seeds = request_seeds(request)
        jobs = {}
        for i, engine in enumerate(self.engines):
            mine = [k for k, r in enumerate(routes) if r == i]
            if mine:
                with self._lock:
                    self.served[i] += len(mine)
                gen = torch.Generator().manual_seed(seeds[mine[0]])
                limits = request.max_new_tokens
                part = request.part([prompts[k] for k in mine], gen, [seeds[k] for k in mine],
                                    [limits[k] for k in mine] if limits is not None else None)  # fmt: skip
                jobs[i] = (mine, self._pool.submit(engine.sample, part))
        out: list[Sample | None] = [None] * len(prompts)
        for mine, fut in jobs.values():
            for k, sample in zip(mine, fut.result(), strict=True):
                out[k] = sample
        return [s for s in out if s is not None]

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        """One pass over ``named_tensors`` feeds every engine's own sync through a bounded queue."""
        queues = [queue.Queue(maxsize=self.queue_depth) for _ in self.engines]
        errors: list[BaseException] = []
        stop = threading.Event()

        def consume(q: queue.Queue) -> Iterator[tuple[str, torch.Tensor]]:
            while (item := q.get()) is not _END:
                yield item

        def run(engine: Any, q: queue.Queue) -> None:
            try:
                engine.sync_weights(consume(q), version=version)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                while q.get() is not _END:  # drain so the producer never blocks on a dead consumer
                    pass

        futs = [self._pool.submit(run, e, q) for e, q in zip(self.engines, queues, strict=True)]
        try:
            for item in named_tensors:
                if stop.is_set():
                    break
                for q in queues:
                    q.put(item)
        finally:
            for q in queues:
                q.put(_END)
            for f in futs:
                f.result()
        if errors:
            raise errors[0]

    def close(self) -> None:
        for e in self.engines:
            e.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
