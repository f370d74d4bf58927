"""User-facing errors.

Every mistake a user can make (bad path, bad config, bad input) raises a subclass of
:class:`CadenzaError`; the CLI prints its message as one line and exits 2, never a traceback.
``assert`` is reserved for internal invariants.
"""


class CadenzaError(ValueError):
    """A user error: the message names the problem and the fix, on one line."""


class ConfigError(CadenzaError):
    """A config file or option is wrong (unknown key, wrong type, impossible value)."""


def need(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``ok``: a config check reads as one line."""
    if not ok:
        raise ConfigError(message)


class SourceError(CadenzaError):
    """A task source cannot be used (missing path, no tests, install failure, not Python)."""


class SandboxError(CadenzaError):
    """The sandbox cannot run (bubblewrap missing, workspace missing)."""


class EngineError(CadenzaError):
    """A rollout engine failed, died or did not answer in time: training stops with this one line."""


class ContextLengthExceeded(CadenzaError):
    """A prompt no longer fits the model's context window: the episode ends as context-exhausted
    (``stop_reason = "context"``) and is graded like any other; it is not an engine failure."""


_CONTEXT_MARKERS = (
    "context length",  # vLLM and OpenAI ("maximum context length"), SGLang ("the model's context length")
    "context_length_exceeded",  # OpenAI's error code
    "context window",
)


def is_context_overflow(message: str) -> bool:
    """Whether a server's error text says the request outgrew the context window (HTTP 400 bodies)."""
    text = message.lower()
    return any(m in text for m in _CONTEXT_MARKERS)
