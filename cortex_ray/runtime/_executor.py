"""Where runs and turns execute: the seam between the HTTP API and the session actors.

The API records a run (``Runtime.start_run``) and hands its id to an ``Executor``, which
drives it to a terminal state somewhere: in this process (``InProcessExecutor``, for one
machine and tests) or in a per-session Ray actor (``actors.SessionManager``). Both resume a
RUNNING run from its ledger, so either can pick up what the other left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from cortex_ray._types import MemoryRecord, Principal, TurnResult
from cortex_ray.cycle import TurnEventSink
from cortex_ray.runtime._runtime import Runtime

__all__ = ["Executor", "InProcessExecutor"]

log = logging.getLogger("cortex_ray.executor")


@runtime_checkable
class Executor(Protocol):
    """Drives runs and sessions that the caller has already recorded and authorised."""

    async def start_run(self, org_id: str, run_id: UUID) -> None:
        """Begin (or resume) driving a RUNNING run; returns at once."""
        ...

    async def turn(
        self,
        org_id: str,
        session_id: UUID,
        caller: Principal,
        message: str,
        *,
        turn_id: UUID | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn; turns of one session run one at a time, in arrival order.

        ``turn_id`` names a turn ``Runtime.accept_turn`` recorded: it runs to its end
        whether or not the caller keeps waiting (a caller that goes away loses only the
        events; the turn's row and the history have the rest). Without one the turn is
        accepted on arrival. ``on_event`` hears the turn's events as they happen, in this
        process (see ``Runtime.run_turn``)."""
        ...

    async def recover_turn(self, org_id: str, session_id: UUID, turn_id: UUID) -> None:
        """Drive an accepted turn again whose driver went away (``Runtime.orphaned_turns``);
        returns once that is arranged. A turn already being driven here is left alone."""
        ...

    async def end_session(self, org_id: str, session_id: UUID) -> list[MemoryRecord]:
        """End a session (the extraction pass runs) and release what holds it."""
        ...


class InProcessExecutor:
    """Runs everything as asyncio tasks of this process, on one ``Runtime``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._runs: dict[UUID, asyncio.Task[object]] = {}
        self._session_locks: dict[UUID, asyncio.Lock] = {}
        # Strong references: a turn runs to its end even if whoever waited on it went away.
        self._turns: dict[UUID, asyncio.Task[TurnResult]] = {}
        self._turn_session: dict[UUID, UUID] = {}

    async def start_run(self, org_id: str, run_id: UUID) -> None:
        running = self._runs.get(run_id)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._drive(org_id, run_id), name=f"run-{run_id}")
        self._runs[run_id] = task

    async def _drive(self, org_id: str, run_id: UUID) -> object:
        try:
            return await self.runtime.drive_run(org_id, run_id)
        except Exception:
            # The run stays RUNNING with its ledger intact; start_run resumes it.
            log.exception("run %s stopped with an error; it can be resumed", run_id)
            raise
        finally:
            self._runs.pop(run_id, None)

    async def wait(self, run_id: UUID) -> None:
        """Wait for a run started here (tests, the CLI)."""
        task = self._runs.get(run_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def turn(
        self,
        org_id: str,
        session_id: UUID,
        caller: Principal,
        message: str,
        *,
        turn_id: UUID | None = None,
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        if turn_id is None:
            # Accepted in arrival order (the lock is FIFO); the turns' ordinals order them.
            lock = self._session_locks.setdefault(session_id, asyncio.Lock())
            async with lock:
                accepted = await self.runtime.turns.accept(org_id, session_id, caller.id, message)
            turn_id = accepted.id
        running = self._turns.get(turn_id)
        if running is None or running.done():

            async def drive() -> TurnResult:
                session = await self.runtime.store.get_session(org_id, session_id)
                return await self.runtime.run_turn(
                    session, caller, message, turn_id=turn_id, on_event=on_event
                )

            running = self._keep(session_id, turn_id, drive())
        # Shielded: a caller that stops waiting never stops the turn.
        return await asyncio.shield(running)

    async def recover_turn(self, org_id: str, session_id: UUID, turn_id: UUID) -> None:
        running = self._turns.get(turn_id)
        if running is not None and not running.done():
            return
        self._keep(session_id, turn_id, self.runtime.recover_turn(org_id, session_id, turn_id))

    def _keep(
        self, session_id: UUID, turn_id: UUID, coro: Coroutine[Any, Any, TurnResult]
    ) -> asyncio.Task[TurnResult]:
        task = asyncio.create_task(coro, name=f"turn-{turn_id}")
        self._turns[turn_id] = task
        self._turn_session[turn_id] = session_id

        def forget(done: asyncio.Task[TurnResult]) -> None:
            if self._turns.get(turn_id) is done:
                del self._turns[turn_id]
                del self._turn_session[turn_id]
            if not done.cancelled() and (error := done.exception()) is not None:
                log.debug("turn %s ended with %r", turn_id, error)

        task.add_done_callback(forget)
        return task

    async def end_session(self, org_id: str, session_id: UUID) -> list[MemoryRecord]:
        # The session's turns driven here end first (they would be refused once it ended).
        mine = [t for i, t in self._turns.items() if self._turn_session.get(i) == session_id]
        await asyncio.gather(*mine, return_exceptions=True)
        lock = self._session_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            session = await self.runtime.store.get_session(org_id, session_id)
            facts = await self.runtime.end_session(session)
        self._session_locks.pop(session_id, None)
        return facts

    async def aclose(self) -> None:
        # A cancelled turn gives its lease up; it is recovered by the next process.
        tasks = [*self._runs.values(), *self._turns.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
