"""Every error a cortex-ray user can catch, in one place.

    CortexError
    ├── ConfigurationError        settings that cannot work (bad DSN, missing extra, no model file)
    ├── StorageError              the database cannot be reached or migrated
    ├── NotFoundError             an agent, run or session that does not exist in this organisation
    ├── InvalidRequestError       input a caller can fix (empty goal, max_steps out of range, ...)
    ├── AccessDeniedError         a principal may not do what it asked
    ├── ConflictError             the object's state forbids it now (an ended session, a full
    │                             queue of turns): the same request may work later or never
    │   └── LeaseLost             a run's driver lost its lease (another driver took the run, or
    │                             it ended): it stops, writing nothing more
    ├── UnavailableError          what would serve the call is down or unreachable right now
    │   ├── OverloadedError       at capacity: new work is refused before it is accepted,
    │   │                         with when to try again (``retry_after_s``)
    │   └── ConnectorUnavailableError  a connector's server (MCP) cannot be reached, refused
    │                             the credentials, died mid-call or answered garbage
    ├── DeadlineExceededError     an accepted turn or run reached its own deadline while it
    │                             waited (for a model over capacity): it ends with that reason
    └── ModelError                a model backend failed or answered nonsense
        └── StructuredOutputError structured output still invalid after the bounded retries

Tool failures never raise out of the decision cycle: the invocation gate turns them into an
``Observation`` with a REFUSED, ERROR or TIMEOUT status, and the step that made them is recorded.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "ConfigurationError",
    "ConflictError",
    "ConnectorUnavailableError",
    "CortexError",
    "DeadlineExceededError",
    "InvalidRequestError",
    "LeaseLost",
    "ModelError",
    "NotFoundError",
    "OverloadedError",
    "StorageError",
    "StructuredOutputError",
    "UnavailableError",
]


class CortexError(Exception):
    """Base of every error raised by cortex-ray."""


class ConfigurationError(CortexError):
    """The settings cannot work as given."""


class StorageError(CortexError):
    """The database could not be reached, started or migrated."""


class NotFoundError(CortexError):
    """The named object does not exist in the caller's organisation."""


class InvalidRequestError(CortexError):
    """The request is malformed in a way the caller can fix."""


class AccessDeniedError(CortexError):
    """The principal is not allowed to perform the action."""


class ConflictError(CortexError):
    """The object's current state does not allow the request (e.g. the session has ended)."""


class LeaseLost(ConflictError):
    """A run's lease is no longer this driver's: the run ended (finished, cancelled, given
    up) or another driver took it over after the lease expired. The write that found out
    was rolled back; the driver stops without recording anything more."""


class UnavailableError(CortexError):
    """What would serve the request is down or cannot be reached now; it may work later."""


class OverloadedError(UnavailableError):
    """Too much work is in progress to take more now; nothing was recorded. Try again after
    ``retry_after_s`` seconds (an estimate; HTTP sends it as ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float = 5.0) -> None:
        super().__init__(message)  # args: the message alone; pickled with its attribute
        self.retry_after_s = retry_after_s


class ConnectorUnavailableError(UnavailableError):
    """A connector's server (an MCP server) cannot serve the call: it cannot be reached or
    started, refused the credentials, died in the middle of the call or answered something
    that is not MCP. The message says which; the next call opens a new session (after a
    backoff when connecting failed)."""


class DeadlineExceededError(CortexError):
    """Accepted work (a turn, a run's step) reached its own deadline while it waited; the
    message says whose deadline and what it waited for. The turn or run ends with it."""


class ModelError(CortexError):
    """A model backend failed."""


class StructuredOutputError(ModelError):
    """A structured model call produced no valid output within its retry budget."""

    def __init__(self, message: str, *, attempts: int, last_output: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_output = last_output
