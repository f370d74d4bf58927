"""A small client for OpenAI-compatible chat completions (vLLM, SGLang, llama.cpp server, OpenAI).

Only the standard library: ``urllib`` with a timeout per request, retries with exponential backoff
on connection errors, 408/409/429 and 5xx, and one clear :class:`LLMError` when the endpoint is
down or answers something that is not a chat completion. Callers decide what an error means for
their run (the agent loop marks the episode errored and moves on).
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from cadenza.errors import CadenzaError, ContextLengthExceeded, is_context_overflow

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class LLMError(CadenzaError):
    """The endpoint could not be used: ``kind`` is ``unreachable``, ``http``, ``garbage`` or ``context``."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class LLMContextError(LLMError, ContextLengthExceeded):
    """The server refused the conversation as longer than its context window (HTTP 400): not retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="context")


@dataclass(kw_only=True)
class LLMConfig:
    """Where and how to call the model. ``endpoint`` is a base URL (``http://host:8000/v1``) or the full
    ``.../chat/completions`` URL; ``api_key`` defaults to none (local servers do not need one)."""

    endpoint: str
    model: str
    api_key: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 1.0
    temperature: float = 0.0
    max_tokens: int | None = 2048
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise CadenzaError(
                f"endpoint {self.endpoint!r} is not an http(s) URL; pass e.g. --endpoint "
                "http://127.0.0.1:8000/v1"
            )
        if not self.model:
            raise CadenzaError("no model name given; pass --model NAME as the server knows it")

    @property
    def url(self) -> str:
        url = self.endpoint.rstrip("/")
        return url if url.endswith("/chat/completions") else url + "/chat/completions"


@dataclass(kw_only=True)
class ChatReply:
    message: dict[str, Any]  # the assistant message, OpenAI format (content, tool_calls)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0


class ChatClient:
    """``complete(messages, tools)`` → :class:`ChatReply`; thread-safe (no shared mutable state)."""

    def __init__(self, config: LLMConfig) -> None:
        self.config = config

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **overrides: Any
    ) -> ChatReply:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature}
        if cfg.max_tokens is not None:
            body["max_tokens"] = cfg.max_tokens
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        body.update(cfg.extra_body)
        body.update(overrides)
        data = json.dumps(body).encode()
        last: LLMError | None = None
        wait = 0.0
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                # Exponential backoff with jitter (concurrent episodes must not retry in lockstep);
                # a server's Retry-After wins when it asks for longer.
                time.sleep(max(wait, cfg.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random())))
            start = time.perf_counter()
            try:
                raw = self._post(data)
            except LLMError as exc:
                if exc.kind == "context" or (
                    exc.kind == "http" and getattr(exc, "status", 0) not in _RETRY_STATUS
                ):
                    raise
                last = exc
                wait = min(float(getattr(exc, "retry_after", 0.0)), 60.0)
                continue
            reply = parse_reply(raw, cfg.url)
            reply.latency_s = time.perf_counter() - start
            return reply
        assert last is not None
        raise LLMError(f"{last} (after {cfg.max_retries + 1} attempts)", kind=last.kind)

    def _post(self, data: bytes) -> bytes:
        cfg = self.config
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        req = urllib.request.Request(cfg.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace").strip().replace("\n", " ")
            if exc.code in (400, 413) and is_context_overflow(detail):
                raise LLMContextError(f"endpoint {cfg.url} answered HTTP {exc.code}: {detail}") from None
            err = LLMError(
                f"endpoint {cfg.url} answered HTTP {exc.code}: {detail or exc.reason}", kind="http"
            )
            err.status = exc.code  # type: ignore[attr-defined]
            try:
                err.retry_after = float(exc.headers.get("Retry-After", 0) or 0)  # type: ignore[attr-defined]
            except (TypeError, ValueError):  # an HTTP date instead of seconds: use our own backoff
                err.retry_after = 0.0  # type: ignore[attr-defined]
            raise err from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LLMError(
                f"endpoint {cfg.url} is unreachable ({reason}); is the server running?", kind="unreachable"
            ) from None


def parse_reply(raw: bytes, url: str = "endpoint") -> ChatReply:
    """Validate a chat-completions response body; garbage becomes a one-line :class:`LLMError`."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        snippet = raw[:80].decode("utf-8", "replace").replace("\n", " ")
        raise LLMError(f"{url} did not return JSON (starts with {snippet!r})", kind="garbage") from None
    if not isinstance(obj, dict):
        raise LLMError(f"{url} returned JSON that is not an object", kind="garbage")
    if "error" in obj and "choices" not in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        if is_context_overflow(str(msg)):
            raise LLMContextError(f"{url} returned an error: {msg}")
        raise LLMError(f"{url} returned an error: {msg}", kind="http")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMError(
            f"{url} returned no choices; is it an OpenAI-compatible chat-completions server?", kind="garbage"
        )
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise LLMError(f"{url} returned a choice without a message", kind="garbage")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": msg.get("content") if isinstance(msg.get("content"), str) else None,
    }
    calls = []
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise LLMError(f"{url} returned a malformed tool call (no function name)", kind="garbage")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(
            {
                "id": str(tc.get("id") or f"call_{i}"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    if not calls and message["content"]:
        calls = _calls_in_text(message["content"])
    if calls:
        message["tool_calls"] = calls
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    return ChatReply(message=message, finish_reason=choices[0].get("finish_reason"), usage=usage)


_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def _calls_in_text(content: str) -> list[dict[str, Any]]:
    """Tool calls a server left in the text (Hermes/Qwen ``<tool_call>{"name": .., "arguments":
    ..}</tool_call>``),
    for servers started without a tool-call parser. Blocks that are not valid JSON are left as text."""
    calls = []
    for i, m in enumerate(_TOOL_CALL_TAG.finditer(content)):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", {})
            calls.append(
                {
                    "id": f"call_text_{i}",
                    "type": "function",
                    "function": {
                        "name": obj["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
    return calls
