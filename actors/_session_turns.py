"""A session actor's turns: one at a time, in the order they were accepted, each under a
lease held in the session's name (a part of ``AgentSession``, see ``actors._session``)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from actors._exceptions import SessionBusyError, _SessionPassivating
from actors._naming import ActorKey
from cortex_ray import (
    Principal,
    Runtime,
    SessionPolicy,
    TurnEvent,
    TurnResult,
    events_until,
)
from cortex_ray.observability import metrics

__all__ = ["TurnServing"]

log = logging.getLogger("actors.session")


class TurnServing:
    """The turn methods of a session actor (``AgentSession`` sets the attributes below in its
    constructor and provides the helpers)."""

    _policy: SessionPolicy
    _runtime: Runtime
    _actor_id: str
    _closing: bool
    _pending: int
    _lock: asyncio.Lock
    _last_used: float
    _background: set[asyncio.Task[Any]]
    _turns: dict[uuid.UUID, asyncio.Task[TurnResult]]
    _reactivation: bool | None

    @property
    def _bound(self) -> ActorKey:
        raise NotImplementedError

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    def _tell_directory(self, method: str, *args: Any) -> None:
        raise NotImplementedError

    async def turn(
        self, caller: Principal, message: str, turn_id: uuid.UUID | None = None
    ) -> AsyncIterator[TurnEvent | TurnResult]:
        """One turn, streamed: its events as they happen, then its ``TurnResult`` last.

        ``turn_id`` names a turn the API accepted (``Runtime.accept_turn``, which bounds the
        queue); without one the turn is accepted here, and refused busy beyond
        ``max_pending_turns``. Turns run one at a time in the order they were accepted,
        under a lease owned by this actor's key name. The turn runs to its end even if the
        caller stops listening (it is then in the history, and its events in its row)."""
        key = self._bound
        if self._closing:
            raise _SessionPassivating(key.name)
        running = None if turn_id is None else self._turns.get(turn_id)
        if running is None or running.done():
            if turn_id is None and self._pending >= self._policy.max_pending_turns:
                metrics.record(metrics.TURNS_REJECTED, org=key.org_id, reason="busy")
                raise SessionBusyError(
                    f"session {key.id} already has {self._pending} turn(s) running or "
                    f"queued (limit {self._policy.max_pending_turns}); try again when it answers"
                )
            events: asyncio.Queue[TurnEvent] = asyncio.Queue()
            running = self._start_turn(
                turn_id, self._run_turn(caller, message, turn_id, events.put_nowait)
            )
            async for event in events_until(running, events):
                yield event
        # Already driven here (recovered before its caller came back): only its result.
        yield await asyncio.shield(running)

    async def recover_turn(self, turn_id: uuid.UUID) -> None:
        """Drive an accepted turn again whose driver went away (``Runtime.recover_turn``);
        returns at once. A turn already in flight here is left alone."""
        key = self._bound
        if self._closing:
            raise _SessionPassivating(key.name)
        running = self._turns.get(turn_id)
        if running is None or running.done():
            self._start_turn(
                turn_id, self._runtime.recover_turn(key.org_id, key.id, turn_id, owner=key.name)
            )

    async def _recover_held_turns(self, key: ActorKey) -> None:
        try:
            turn_ids = await self._runtime.turns.resumable(key.org_id, key.id, key.name)
            for turn_id in turn_ids:
                await self.recover_turn(turn_id)
        except Exception:  # the supervisor recovers them once their leases expire
            log.warning("%s: its turns could not be recovered after a restart", key.name)
            return
        if turn_ids:
            log.info("%s: restarted; %d turn(s) driven again at once", key.name, len(turn_ids))

    def _start_turn(self, turn_id: uuid.UUID | None, coro: Any) -> asyncio.Task[TurnResult]:
        """Run a turn as a task this actor holds (it outlives the call that started it)."""
        key = self._bound
        self._pending += 1
        self._last_used = time.monotonic()
        running: asyncio.Task[TurnResult] = asyncio.create_task(coro)
        self._background.add(running)
        if turn_id is not None:
            self._turns[turn_id] = running

        def done(task: asyncio.Task[TurnResult]) -> None:
            self._background.discard(task)
            if turn_id is not None and self._turns.get(turn_id) is task:
                del self._turns[turn_id]
            self._pending -= 1
            self._last_used = time.monotonic()
            self._tell_directory("touch", key.name, self._actor_id)
            if not task.cancelled() and (error := task.exception()) is not None:
                log.debug("%s: turn %s ended with %r", key.name, turn_id, error)

        running.add_done_callback(done)
        return running

    async def _run_turn(
        self,
        caller: Principal,
        message: str,
        turn_id: uuid.UUID | None,
        on_event: Callable[[TurnEvent], None],
    ) -> TurnResult:
        key = self._bound
        if turn_id is None:
            # Accepted in arrival order (the lock is FIFO); the ordinals then order the turns.
            async with self._lock:
                accepted = await self._runtime.turns.accept(key.org_id, key.id, caller.id, message)
            turn_id = accepted.id
        if self._reactivation is None:
            # This actor's first turn: a session that had turns before came back to life.
            turn = await self._runtime.turns.get(key.org_id, key.id, turn_id)
            self._reactivation = turn.ordinal > 0
            if self._reactivation:
                metrics.record(metrics.SESSION_REACTIVATIONS, namespace=self._policy.namespace)
        session = await self._runtime.store.get_session(key.org_id, key.id)
        return await self._runtime.run_turn(
            session, caller, message, turn_id=turn_id, owner=key.name, on_event=on_event
        )
