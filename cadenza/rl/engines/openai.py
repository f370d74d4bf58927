"""Token-in / token-out sampling over an OpenAI-compatible completions API (vLLM, SGLang, …).

Prompts go to ``POST /v1/completions`` as token-id lists (never text), one request per prompt with its
own seed drawn from the caller's generator, all in flight at once so the server batches them. The
reply must carry the sampled token ids (vLLM: ``return_token_ids``; or logprob tokens written as
``token_id:N`` by ``return_tokens_as_token_ids``) and one log-prob per token. No chat parser of the
server is used: cadenza renders the chat template and parses tool calls itself. Every call has a
timeout; failures are one-line :class:`EngineError` naming the engine (and its log when it has one).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from cadenza.errors import CadenzaError, ContextLengthExceeded, EngineError
from cadenza.rl.engines.policy import Sample, SampleRequest, SamplingParams


def draw_seeds(n: int, generator: torch.Generator | None) -> list[int]:
    """One request seed per prompt, from the caller's generator (reproducible under a fixed seed)."""
    return [int(s) for s in torch.randint(0, 2**62, (n,), generator=generator)]


def request_seeds(request: SampleRequest) -> list[int]:
    """The request's own per-prompt seeds (set by a router), else drawn from its generator."""
    if request.seeds is not None:
        return list(request.seeds)
    return draw_seeds(len(request.prompts), request.generator)


class CompletionsClient:
    """A minimal HTTP client for the completions endpoint (stdlib only, timeouts everywhere)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        label: str,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        describe: Callable[[], str] | None = None,
        api_key: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.label = label
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.describe = describe or (lambda: f"at {self.base_url}")
        self.api_key = api_key

    def error(self, what: str, cause: object) -> EngineError:
        cause_text = " ".join(str(cause).split())[:300]
        return EngineError(f"engine '{self.label}' {what} failed: {cause_text}; {self.describe()}")

    def post(self, path: str, body: dict[str, Any] | None, *, timeout_s: float, what: str) -> Any:
        data = json.dumps(body if body is not None else {}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            if e.code == 400 and "context length" in detail:
                raise ContextLengthExceeded(f"engine '{self.label}': {_message(detail)}") from None
            raise self.error(what, f"HTTP {e.code}: {_message(detail)}") from None
        except TimeoutError:
            raise self.error(what, f"no answer within {timeout_s:.0f} s") from None
        except (urllib.error.URLError, OSError) as e:
            raise self.error(what, getattr(e, "reason", e)) from None
        return json.loads(raw) if raw else None

    def get_json(self, path: str, *, timeout_s: float) -> Any:
        try:
            with urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise self.error(f"GET {path}", getattr(e, "reason", e)) from None

    def _complete_one(
        self, prompt: Sequence[int], params: SamplingParams, seed: int, limit: int | None = None
    ) -> Sample:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": min(params.max_new_tokens, limit) if limit else params.max_new_tokens,
            "temperature": params.temperature,
            "seed": seed,
            "logprobs": 0,
            "stop_token_ids": [int(t) for t in params.stop_token_ids],
            "ignore_eos": True,  # stop only on the caller's stop ids, exactly like the hf engine
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        out = self.post("/v1/completions", body, timeout_s=self.timeout_s, what="generation")
        return parse_choice(out, self.label)

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int],
        limits: Sequence[int] | None = None,
    ) -> list[Sample]:
        """One request per prompt, all in flight at once; ``limits[i]`` caps prompt i's ``max_tokens``."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise CadenzaError("every prompt must have at least one token")
        caps = list(limits) if limits is not None else [None] * len(prompts)
        return self._fan_out(
            [
                lambda p=p, s=s, c=c: self._complete_one(p, params, s, c)
                for p, s, c in zip(prompts, seeds, caps, strict=True)
            ]
        )

    def _score_one(self, seq: Sequence[int]) -> list[float]:
        body = {
            "model": self.model,
            "prompt": [int(t) for t in seq],
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        out = self.post("/v1/completions", body, timeout_s=self.timeout_s, what="scoring")
        entries = out["choices"][0].get("prompt_logprobs")
        if entries is None:
            raise self.error("scoring", "the reply has no prompt_logprobs")
        lps = []
        for tok, entry in zip(seq[1:], entries[1:], strict=True):
            hit = entry.get(str(tok)) or entry.get(f"token_id:{tok}")
            if hit is None:
                raise self.error("scoring", f"prompt_logprobs lack token {tok}")
            lps.append(float(hit["logprob"] if isinstance(hit, dict) else hit))
        return lps

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-prob of each token given its prefix (temperature 1), for positions 1..T-1."""
        return self._fan_out([lambda s=s: self._score_one(s) for s in sequences])

    def _fan_out(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs))))
        try:
            futures = [pool.submit(j) for j in jobs]
            done, pending = wait(futures, timeout=self.timeout_s + 5, return_when="FIRST_EXCEPTION")
            for f in done:
                if f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
            if pending:
                raise self.error("generation", f"no answer within {self.timeout_s:.0f} s")
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _message(detail: str) -> str:
    try:
        body = json.loads(detail)
    except ValueError:
        return detail.strip()[:300]
    err = body.get("error", body) if isinstance(body, dict) else body
    msg = err.get("message", err) if isinstance(err, dict) else err
    return " ".join(str(msg).split())[:300]


def parse_choice(out: Any, label: str) -> Sample:
    """A :class:`Sample` from one completions reply; a clear error when it carries no token ids."""
    try:
        choice = out["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EngineError(f"engine '{label}' returned no choices: {str(out)[:200]}") from None
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None and lp.get("tokens") and all(str(t).startswith("token_id:") for t in lp["tokens"]):
        ids = [int(str(t).removeprefix("token_id:")) for t in lp["tokens"]]
    if ids is None:
        raise EngineError(
            f"engine '{label}' returned no token ids; the server must support return_token_ids or "
            "return_tokens_as_token_ids (vLLM does; token-in/token-out training cannot re-tokenise text)"
        )
    if logprobs is None or len(logprobs) != len(ids):
        raise EngineError(f"engine '{label}' returned {len(ids)} token ids but no matching log-probs")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise EngineError(f"engine '{label}' ended a request with finish_reason {finish!r}")
    return Sample(
        token_ids=[int(t) for t in ids], logprobs=[float(x) for x in logprobs], finish_reason=finish
    )


@dataclass(kw_only=True)
class OpenAIEngineConfig:
    """An external OpenAI-compatible server (cadenza neither starts nor syncs it)."""

    base_url: str  # e.g. http://127.0.0.1:30000 (without /v1)
    model: str = ""  # served model name; "" = the first one /v1/models lists
    api_key: str = ""  # sent as a bearer token when set
    timeout_s: float = 600.0  # per request
    max_concurrency: int = 64  # requests in flight at once


class OpenAIEngine:
    """Samples from any OpenAI-compatible server that returns token ids; weights are the server's own.

    ``version`` is the policy version the server's weights are known to have: 0 for an external server,
    or what the trainer last synced into a served engine that rollout workers reach over HTTP (the
    driver sets it with :meth:`at_version` after every sync; samples are tagged with it)."""

    name = "openai"
    supports_sync = False

    def __init__(self, config: OpenAIEngineConfig, *, version: int = 0) -> None:
        self.config = config
        self._version = int(version)
        self.client = CompletionsClient(
            config.base_url,
            model=config.model,
            label="openai",
            timeout_s=config.timeout_s,
            max_concurrency=config.max_concurrency,
            api_key=config.api_key,
        )
        if not config.model:
            listed = self.client.get_json("/v1/models", timeout_s=30).get("data") or []
            if not listed:
                raise EngineError(f"engine 'openai' at {config.base_url} serves no models")
            self.client.model = listed[0]["id"]

    @property
    def version(self) -> int:
        return self._version

    def at_version(self, version: int) -> None:
        """Someone else (the trainer) loaded weights of ``version`` into the server."""
        self._version = int(version)

    def sample(self, request: SampleRequest) -> list[Sample]:
        out = self.client.complete(
            request.prompts, request.params, request_seeds(request), request.max_new_tokens
        )
        for s in out:
            s.policy_version = self._version
        return out

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> None:
        raise CadenzaError(
            "engine 'openai' cannot load new weights (it is an external server); use engine 'vllm' for "
            "training, or 'openai' only for evaluation and fixed-policy rollouts"
        )

    def close(self) -> None:
        pass
