"""A llama.cpp replica's line for its model: one generation at a time, a bounded number
waiting, in order of priority then arrival; and what the replica reports of it (its load,
its capacity)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import Counter
from typing import Any

from cortex_ray.models import ChatRequest
from serve.models._config import LlmConfig
from serve.models._openai import Failure

__all__ = ["ModelLine", "ReplicaLine", "request_kind"]

_MEAN_WEIGHT = 0.2
"""Weight of the newest request in the mean time a request holds the model (an EWMA)."""


def request_kind(request: ChatRequest) -> str:
    """What a request is, for the counters: its schema's name, "tools" or "text"."""
    if request.response_schema is not None:
        return request.schema_name
    return "tools" if request.tools else "text"


def _overloaded(model: str, reason: str) -> Failure:
    return Failure(
        503,
        f"the model {model} is over capacity ({reason}); retry later",
        type="server_error",
        code="model_overloaded",
    )


class ModelLine:
    """One model, taken by one request at a time: waiters in order of (priority, arrival).

    An ``asyncio.Lock`` (what the line was) serves in arrival order only, so background
    importance rescorings queued before a run's next proposal made that run wait behind
    them. A waiter that goes away (cancelled, timed out) is skipped; one that was handed the
    model just as it went away hands it on."""

    def __init__(self) -> None:
        self._busy = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    def locked(self) -> bool:
        return self._busy

    async def acquire(self, priority: int = 0) -> None:
        if not self._busy and not self._waiters:
            self._busy = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # it was ours as we left: the next one's now
            raise

    def release(self) -> None:
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():  # a cancelled waiter left its entry behind
                waiter.set_result(None)
                return  # still busy: the model is the waiter's now
        self._busy = False


class ReplicaLine:
    """The replica's admission to its model: at most ``1 + config.max_waiting`` requests in
    flight (one generating, the rest in a :class:`ModelLine`), each waiting at most its own
    ``wait_s`` (a caller's deadline) or ``config.queue_timeout_s``; beyond either a request
    is answered 503 ``model_overloaded`` without running. Counts what it served and refused,
    and how long a request holds the model (what :meth:`load` reports as capacity)."""

    def __init__(self, config: LlmConfig) -> None:
        self._config = config
        self._model_free = ModelLine()
        self._in_flight = 0  # generating (0 or 1) + waiting
        self._served: Counter[str] = Counter()  # by kind: a schema's name, "tools" or "text"
        self._refused: Counter[str] = Counter()
        self._longest_wait_s = 0.0
        self._mean_request_s = 0.0
        self._taken_at = 0.0

    @property
    def model(self) -> ModelLine:
        """The line itself (tests hold the model with it)."""
        return self._model_free

    def load(self) -> dict[str, Any]:
        """This replica's line for the model, as counters."""
        generating = int(self._model_free.locked())
        return {
            "in_flight": self._in_flight,
            "generating": generating,
            "waiting": self._in_flight - generating,
            "max_waiting": self._config.max_waiting,
            "served": sum(self._served.values()),
            "refused": sum(self._refused.values()),
            "served_by_kind": dict(self._served),
            "refused_by_kind": dict(self._refused),
            "longest_wait_s": round(self._longest_wait_s, 3),
            "mean_request_s": round(self._mean_request_s, 3),
        }

    async def admit(
        self, kind: str, priority: int = 0, wait_s: float | None = None
    ) -> Failure | None:
        """Take the model (waiting in line by ``priority``, at most ``wait_s``, default
        ``queue_timeout_s``), or say why not; :meth:`leave` gives it back. ``kind`` labels
        the counters."""
        cfg = self._config
        if self._in_flight >= 1 + cfg.max_waiting:
            self._refused[kind] += 1
            return _overloaded(cfg.model_id, f"{cfg.max_waiting} requests wait for it already")
        bound = cfg.queue_timeout_s if wait_s is None else max(wait_s, 0.0)
        self._in_flight += 1
        started = time.monotonic()
        try:
            # wait_for returns the model when it was taken just as the time ran out
            await asyncio.wait_for(self._model_free.acquire(priority), bound)
        except TimeoutError:
            self._in_flight -= 1
            self._refused[kind] += 1
            return _overloaded(cfg.model_id, f"waited {bound:g} s for it")
        except BaseException:  # the caller went away while waiting
            self._in_flight -= 1
            raise
        self._taken_at = time.monotonic()
        self._longest_wait_s = max(self._longest_wait_s, self._taken_at - started)
        return None

    def leave(self, kind: str) -> None:
        """The model is free again: the next in line takes it."""
        self._in_flight -= 1
        self._served[kind] += 1
        held = time.monotonic() - self._taken_at
        if self._mean_request_s == 0.0:
            self._mean_request_s = held
        else:
            self._mean_request_s += _MEAN_WEIGHT * (held - self._mean_request_s)
        self._model_free.release()
