"""Continuous batching of turns across episodes: each episode asks for its next turn when it is ready,
and the asks waiting at that moment reach the engine as one batch.

Episodes run on their own threads (:func:`cadenza.agent.loop.run_episodes`); a turn's generation does
not wait for other episodes' tool calls, and a tool call does not wait for other episodes'
generation. A batch leaves when every live episode is waiting, or ``linger_s`` after its first ask
(so asks arriving together share it); up to ``inflight`` batches are in flight at once (1 for an
in-process engine, more for a served one, which merges them into its own continuous batch).
``lockstep``: a batch leaves only when every live episode is waiting, and runs in episode order, so
each batch is the same whatever the timing. An in-process engine needs it: its numerics depend on the
batch a prompt runs in (padding, matmul blocking), so a timing-dependent batch would make runs differ.
The rollout's ``schedule = "lockstep"`` (the old loop, kept for ``bench/agent_rollout.py``) also runs
the tools one at a time.

Every ask carries its own seed, so a sample does not depend on which batch it travelled in: the same
seeds give the same trajectories whatever the interleaving.

Long-tail control (:meth:`TurnBatcher.abandon`): once a step has enough finished groups, every ask
still waiting or in flight fails with :class:`EpisodeCut` at once, and so does every later ask; a batch
already at the engine runs to its end and its samples are dropped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from cadenza.errors import ContextLengthExceeded
from cadenza.rl.engines.policy import Sample, SampleRequest, SamplingParams


class EpisodeCut(Exception):
    """The episode was cut (long-tail control): its step has enough finished groups without it."""


@dataclass(kw_only=True)
class _Ask:
    prompt: list[int]
    params: SamplingParams
    seed: int
    key: int = 0  # the episode's index: a lockstep batch runs in this order
    since: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    sample: Sample | None = None
    error: BaseException | None = None


class TurnBatcher:
    """Merges the turn requests of ``episodes`` concurrent episodes into engine batches."""

    def __init__(
        self,
        policy: Any,
        episodes: int,
        *,
        lockstep: bool = False,
        inflight: int = 1,
        linger_s: float = 0.005,
    ) -> None:
        self.policy, self.lockstep, self.linger_s = policy, lockstep, linger_s
        self._cond = threading.Condition()
        self._pending: list[_Ask] = []
        self._active = episodes  # live episodes (an episode leaves when its loop ends)
        self._closed = False
        self._abandoned = False
        self._running: dict[int, list[_Ask]] = {}  # batches at the engine, by id
        self.batches = 0
        self.busy_s = 0.0  # wall time with at least one batch in flight (the engine's busy time)
        self._inflight = 0
        self._busy_since = 0.0
        self._threads = [
            threading.Thread(target=self._serve, daemon=True, name="turn-batcher")
            for _ in range(max(1, inflight))
        ]
        for t in self._threads:
            t.start()

    def sample(self, prompt: list[int], params: SamplingParams, seed: int, key: int = 0) -> Sample:
        """The next turn of episode ``key`` (blocks until its batch returns)."""
        ask = _Ask(prompt=list(prompt), params=params, seed=seed, key=key)
        with self._cond:
            if self._abandoned:
                raise EpisodeCut("the step has enough finished groups")
            self._pending.append(ask)
            self._cond.notify_all()
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        assert ask.sample is not None
        return ask.sample

    def leave(self) -> None:
        """One episode has ended: the batch no longer waits for it."""
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def abandon(self) -> None:
        """Long-tail control: every waiting or in-flight ask, and every later one, fails with
        :class:`EpisodeCut` now (a batch at the engine runs on; its samples are dropped)."""
        with self._cond:
            self._abandoned = True
            asks = self._pending + [a for b in self._running.values() for a in b]
            self._pending = []
            for a in asks:
                if not a.done.is_set():
                    a.error = EpisodeCut("the step has enough finished groups")
                    a.done.set()
            self._cond.notify_all()

    def close(self, wait_s: float | None = 5.0) -> None:
        """Stop the serving threads, waiting up to ``wait_s`` (``None``: until a batch at the engine
        returns; 0: not at all) for each."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=wait_s)

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if len(self._pending) >= self._active or self._closed:
            return True
        return not self.lockstep and time.monotonic() - self._pending[0].since >= self.linger_s

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._ready():
                    if self._closed:
                        return
                    self._cond.wait(timeout=self.linger_s if self._pending and not self.lockstep else None)
                batch, self._pending = self._pending, []
                if self.lockstep:  # every live episode, in episode order: the same batch whatever the timing
                    batch.sort(key=lambda a: a.key)
                if not self._inflight:
                    self._busy_since = time.monotonic()
                self._inflight += 1
                self._running[id(batch)] = batch
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running.pop(id(batch), None)
                    self._inflight -= 1
                    self.batches += 1
                    if not self._inflight:
                        self.busy_s += time.monotonic() - self._busy_since

    def _run(self, batch: list[_Ask]) -> None:
        # one batch shares its parameters; each episode keeps only what fits its own budget
        params = replace(batch[0].params, max_new_tokens=max(a.params.max_new_tokens for a in batch))
        limits = [a.params.max_new_tokens for a in batch]  # each prompt's own remaining context
        request = SampleRequest([a.prompt for a in batch], params, None, [a.seed for a in batch], limits)
        try:
            samples = _sample(self.policy, request)
        except BaseException as exc:  # every ask of the batch fails with the engine's own error
            samples, error = [None] * len(batch), exc
        else:
            error = None
        with self._cond:  # an ask abandoned meanwhile keeps its EpisodeCut
            for a, s in zip(batch, samples, strict=True):
                if not a.done.is_set():
                    a.sample, a.error = s, error
                    a.done.set()


def _sample(policy: Any, request: SampleRequest) -> list[Sample]:
    """One batched call; when the engine refuses the batch as too long, find out prompt by prompt (only
    the prompt that does not fit ends, as ``context``)."""
    try:
        return policy.sample(request)
    except ContextLengthExceeded:
        if len(request.prompts) == 1:
            return [Sample(token_ids=[], logprobs=[], finish_reason="context")]
        seeds, limits = list(request.seeds or []), request.max_new_tokens
        return [
            _sample(policy, request.part([p], None, [seeds[k]], [limits[k]] if limits else None))[0]
            for k, p in enumerate(request.prompts)
        ]
