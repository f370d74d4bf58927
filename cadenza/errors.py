"""User-facing errors.

Every mistake a user can make (bad path, bad config, bad input) raises a subclass of
:class:`CadenzaError`; the CLI prints its message as one line and exits 2, never a traceback.
``assert`` is reserved for internal invariants.
"""


class CadenzaError(ValueError):
    """A user error: the message names the problem and the fix, on one line."""


class ConfigError(CadenzaError):
    """A config file or option is wrong (unknown key, wrong type, impossible value)."""


class SourceError(CadenzaError):
    """A task source cannot be used (missing path, no tests, install failure, not Python)."""


class SandboxError(CadenzaError):
    """The sandbox cannot run (bubblewrap missing, workspace missing)."""
