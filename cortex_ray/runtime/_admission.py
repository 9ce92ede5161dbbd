"""Admission: new turns and runs are taken only while the shared models can hold them.

An accepted turn or run is a promise: it waits for the model when it must (until its own
deadline, ``cortex_ray.models.waiting_until``) but never fails halfway because the model's
line was full. So the promise is not made beyond what the models hold: before a turn or a
run is recorded, the work in progress (turns not ended and RUNNING runs that a driver holds,
that were just accepted, or that wait behind their session's live turn, in every
organisation: they share the models) is compared with the limit, ``runs.max_in_progress``,
or, when that is 0, the capacity the served model reports (its replicas × (1 +
``max_waiting``): one model call of each piece of work fits in its lines), lowered to what
the model's recent pace serves within a deadline (a piece of work waits behind the others
for each of its calls). At the limit the
request is refused with ``OverloadedError`` (HTTP 503 ``overloaded`` with ``Retry-After``)
and nothing is stored.

The count and the insert are not one transaction: requests admitted at the same instant may
pass the limit by how many arrive together (the model's line then holds them: each waits its
turn). Scheduled runs are not admitted here: a schedule's firing is already durable work.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

from cortex_ray._exceptions import OverloadedError
from cortex_ray.models import CapacityReporter, ModelCapacity, ModelClient
from cortex_ray.observability import metrics
from cortex_ray.storage import WorkCounter

__all__ = ["Admission"]

log = logging.getLogger("cortex_ray.runtime")

_CALLS_PER_WORK = 3
"""Model calls a turn or a run step makes, about (propose, evaluate or reply, importance):
what the retry estimate multiplies the model's mean request time by."""
_RETRY_MIN_S = 1
_RETRY_MAX_S = 120
_RETRY_UNKNOWN_S = 5


class Admission:
    """Decides whether one more turn or run may be accepted now (see the module docstring).

    Args:
        counter: Counts the work in progress (the store).
        model: The chat model; its capacity is asked when it reports one
            (``CapacityReporter``, the ``served`` backend's client).
        limit: ``runs.max_in_progress``: a fixed limit; 0 takes the model's capacity (no
            limit when it reports none).
        recent_s: Work created this recently counts although no driver holds it yet
            (``runs.orphan_grace_s``: after it, an undriven run is the supervisor's).
        deadline_s: The shorter of a turn's and a step's deadline: with the model's
            capacity, no more work is admitted than its recent pace serves within it
            (0: the places alone).
    """

    def __init__(
        self,
        counter: WorkCounter,
        model: ModelClient | None,
        limit: int,
        recent_s: float,
        deadline_s: float = 0.0,
    ) -> None:
        self._counter = counter
        self._model = model if isinstance(model, CapacityReporter) else None
        self._limit = limit
        self._recent_s = recent_s
        self._deadline_s = deadline_s

    async def admit(self, org_id: str, kind: Literal["turn", "run"]) -> None:
        """Return when one more ``kind`` may be accepted.

        Raises:
            OverloadedError: The work in progress is at the limit; its ``retry_after_s``
                estimates when a place frees (the model's mean request time × the calls a
                piece of work makes ÷ its replicas).
        """
        capacity = await self._capacity()
        limit = self._limit or (self._served_limit(capacity) if capacity is not None else 0)
        if limit <= 0:
            return
        active = await self._counter.work_in_progress(self._recent_s)
        if active < limit:
            return
        retry = _retry_after(capacity)
        metrics.record(metrics.TURNS_REJECTED if kind == "turn" else metrics.RUNS_REJECTED,
                       org=org_id, reason="overloaded")  # fmt: skip
        log.info("refused a %s of %s: %d in progress (limit %d)", kind, org_id, active, limit)
        raise OverloadedError(
            f"at capacity: {active} turns and runs are in progress (limit {limit}); nothing "
            f"was recorded: try again in {retry} s",
            retry_after_s=retry,
        )

    def _served_limit(self, capacity: ModelCapacity) -> int:
        """The model's places, and no more work than it serves within a deadline: each
        piece waits behind the others for each of its calls, so at the model's recent pace
        ``deadline_s × replicas ÷ (calls × mean_request_s)`` pieces end in time."""
        limit = capacity.slots
        if capacity.mean_request_s > 0 and self._deadline_s > 0:
            in_time = self._deadline_s * max(capacity.replicas, 1)
            in_time /= _CALLS_PER_WORK * capacity.mean_request_s
            limit = min(limit, max(1, math.floor(in_time)))
        return limit

    async def _capacity(self) -> ModelCapacity | None:
        if self._model is None:
            return None
        try:
            return await self._model.capacity()
        except Exception:  # admission must not fail because a report did
            log.warning("the model's capacity could not be read", exc_info=True)
            return None


def _retry_after(capacity: ModelCapacity | None) -> int:
    """Seconds until a place likely frees: one piece of work's model calls at the model's
    recent pace, spread over its replicas (bounded; 5 s when the pace is not known)."""
    if capacity is None or capacity.mean_request_s <= 0:
        return _RETRY_UNKNOWN_S
    estimate = capacity.mean_request_s * _CALLS_PER_WORK / max(capacity.replicas, 1)
    return max(_RETRY_MIN_S, min(_RETRY_MAX_S, math.ceil(estimate)))
