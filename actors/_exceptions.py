"""Errors of the session-actor layer, under cortex-ray's one hierarchy.

    CortexError                       (cortex_ray)
    ├── ConflictError                 (cortex_ray)
    │   └── SessionBusyError          the session's queue of turns is full: try again later (409)
    └── UnavailableError              (cortex_ray)
        └── SessionUnavailableError   the actor died or could not be reached; a turn that
                                      was running may or may not have taken effect (503)

Both are also ``SessionError``s: a session or run actor could not serve the call.

Errors the core raises inside an actor (``NotFoundError``, ``InvalidRequestError``, ...) reach
the caller as themselves: Ray re-raises an actor's exception as an instance of its class.
"""

from __future__ import annotations

from cortex_ray import ConflictError, CortexError, UnavailableError

__all__ = ["SessionBusyError", "SessionError", "SessionUnavailableError"]


class SessionError(CortexError):
    """A session or run actor could not serve the call."""


class SessionBusyError(SessionError, ConflictError):
    """The session already holds as many turns as its queue allows (``max_pending_turns``)."""


class SessionUnavailableError(SessionError, UnavailableError):
    """The session's actor died or could not be reached in time.

    Raised without retrying when a turn may already have run (the actor died while it ran):
    interactive tool calls carry no idempotency key, so repeating them is the caller's call.
    """


class _SessionPassivating(SessionError):
    """The actor is passivating: the turn was refused before anything ran; retry at once."""
