"""Where runs and turns execute: the seam between the HTTP API and the session actors.

The API records a run (``Runtime.start_run``) and hands its id to an ``Executor``, which
drives it to a terminal state somewhere: in this process (``InProcessExecutor``, for one
machine and tests) or in a per-session Ray actor (``actors.SessionManager``). Both resume a
RUNNING run from its ledger, so either can pick up what the other left.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, runtime_checkable
from uuid import UUID

from cortex_ray._runtime import Runtime, TurnEventSink
from cortex_ray._types import MemoryRecord, Principal, TurnResult

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
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        """One interactive turn; turns of one session run one at a time, in arrival order.

        ``on_event`` hears the turn's events as they happen, in this process (see
        ``Runtime.run_turn``)."""
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
        on_event: TurnEventSink | None = None,
    ) -> TurnResult:
        lock = self._session_locks.setdefault(session_id, asyncio.Lock())
        async with lock:  # one message at a time per session; later ones queue
            session = await self.runtime.store.get_session(org_id, session_id)
            return await self.runtime.run_turn(session, caller, message, on_event=on_event)

    async def end_session(self, org_id: str, session_id: UUID) -> list[MemoryRecord]:
        lock = self._session_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            session = await self.runtime.store.get_session(org_id, session_id)
            facts = await self.runtime.end_session(session)
        self._session_locks.pop(session_id, None)
        return facts

    async def aclose(self) -> None:
        for task in list(self._runs.values()):
            task.cancel()
        await asyncio.gather(*self._runs.values(), return_exceptions=True)
