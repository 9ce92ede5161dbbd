"""How long a model call may wait for a model over capacity, and what a model reports of
its capacity.

A model that serves many callers has a line (``serve.models``: one generation at a time per
replica, ``max_waiting`` more in line). Accepted work must not fail halfway because the line
was full: the cycle sets the turn's or the run step's own deadline around its model calls
(:func:`waiting_until`), and a client that meets a full line keeps its place or tries again
until then (:func:`current_deadline`), raising ``DeadlineExceededError`` when it passes.
Admission (``cortex_ray.runtime``) asks a client that can tell for its capacity
(:class:`CapacityReporter`) before it accepts new work.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from cortex_ray._exceptions import DeadlineExceededError

__all__ = [
    "CapacityReporter",
    "Deadline",
    "ModelCapacity",
    "current_deadline",
    "waiting_until",
]


@dataclass(frozen=True, slots=True)
class Deadline:
    """When the work a model call is part of must end (``time.monotonic()`` seconds), and
    whose deadline it is, for the reason the work ends with ("the turn's deadline, 900 s
    after it was accepted")."""

    at: float
    what: str

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.at - time.monotonic()

    def exceeded(self, waiting_for: str) -> DeadlineExceededError:
        """The error that ends the work: its deadline passed while it waited for ``waiting_for``."""
        return DeadlineExceededError(f"{self.what} passed while waiting for {waiting_for}")


_current: ContextVar[Deadline | None] = ContextVar("cortex_model_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadline of the work the current model call belongs to (``None``: no bound but
    the client's own)."""
    return _current.get()


@contextmanager
def waiting_until(when: datetime | float, what: str) -> Iterator[Deadline]:
    """Model calls made inside wait for a model over capacity until ``when`` (an aware
    datetime, or ``time.monotonic()`` seconds), never past an enclosing deadline."""
    if isinstance(when, datetime):
        at = time.monotonic() + (when - datetime.now(when.tzinfo)).total_seconds()
    else:
        at = when
    outer = _current.get()
    deadline = Deadline(at, what)
    if outer is not None and outer.at <= at:
        deadline = outer
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


@dataclass(frozen=True, slots=True)
class ModelCapacity:
    """What a served model can hold at once, as its serving layer reports it.

    Attributes:
        slots: Requests it holds at once (generating and in line) over all its replicas:
            work beyond this many callers would meet a full line.
        waiting: Requests in line now (as last seen).
        replicas: Replicas serving it.
        mean_request_s: Recent mean seconds one request holds a replica (0: not known yet).
    """

    slots: int
    waiting: int
    replicas: int
    mean_request_s: float


@runtime_checkable
class CapacityReporter(Protocol):
    """A model client that can say how much its model holds (the ``served`` backend's)."""

    async def capacity(self) -> ModelCapacity | None:
        """The model's capacity now, or ``None`` when it cannot tell."""
        ...
