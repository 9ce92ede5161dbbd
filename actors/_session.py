"""The ``AgentSession`` actor: one per live session or task run, found by name.

Everything it knows is in PostgreSQL, so it can stop at any time and come back:

- a **run** actor drives its run from the constructor (``Runtime.drive_run`` continues after
  the last recorded step), so a restart by Ray (``max_restarts=-1``) resumes the run, and it
  exits when the run reaches a terminal state;
- a **session** actor serves turns one at a time, passivates (exits) after
  ``idle_timeout_s`` without a turn or when the directory evicts it, and is created again by
  the next message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import RayError

from actors._exceptions import SessionBusyError, _SessionPassivating
from actors._factory import RuntimeFactory
from actors._naming import DIRECTORY_NAME, ActorKey
from cortex_ray import (
    MemoryRecord,
    Principal,
    RunStatus,
    Runtime,
    SessionPolicy,
    Settings,
    TurnEvent,
    TurnResult,
    events_until,
)

__all__ = ["AgentSession", "get_or_create"]

log = logging.getLogger("actors.session")


def get_or_create(
    key: ActorKey, settings: Settings, factory: RuntimeFactory, policy: SessionPolicy
) -> ActorHandle[Any]:
    """The live actor for ``key``, created if there is none (one name, one actor)."""
    actor_class = cast("ActorClass[Any]", AgentSession)
    handle = actor_class.options(**_OPTIONS, name=key.name, namespace=policy.namespace).remote(
        key, settings, factory, policy
    )
    return cast("ActorHandle[Any]", handle)


_OPTIONS: dict[str, Any] = {
    "get_if_exists": True,
    # Detached: the actor outlives the API replica that created it, so any replica (or a
    # restarted one) finds it by name; it ends itself (passivation, end of run).
    "lifetime": "detached",
    # Ray re-runs the constructor with the same arguments after the process dies (not
    # after ray.kill(no_restart=True) or an intended exit); a run actor then resumes.
    "max_restarts": -1,
    # A call that was running when the process died may have had effects: never retried
    # by Ray; callers decide (see SessionManager.turn and the directory's run watcher).
    "max_task_retries": 0,
    # Sessions wait on PostgreSQL and models, not on a CPU: scheduling them by CPU would
    # cap the live sessions at the number of cores.
    "num_cpus": 0,
}


@ray.remote
class AgentSession:
    """The actor for one :class:`~actors.ActorKey` (a run or a session)."""

    async def __init__(  # type: ignore[misc]  # Ray awaits an async constructor
        self,
        key: ActorKey,
        settings: Settings,
        factory: RuntimeFactory,
        policy: SessionPolicy,
    ) -> None:
        self._key = key
        self._policy = policy
        self._actor_id = ray.get_runtime_context().get_actor_id()
        self._closing = False
        self._pending = 0  # turns admitted: running + waiting for the lock
        self._lock = asyncio.Lock()  # FIFO: one turn at a time, in order of admission
        self._last_used = time.monotonic()
        self._background: set[asyncio.Task[Any]] = set()
        self._runtime: Runtime = await factory(settings)
        self._drive: asyncio.Task[RunStatus] | None = None
        self._idle: asyncio.Task[None] | None = None
        if key.kind == "run":
            # Resume (or begin) at once: after a crash Ray re-runs this constructor.
            self._drive = asyncio.create_task(self._drive_run(), name=f"drive {key.name}")
        else:
            self._idle = asyncio.create_task(self._idle_watch(), name=f"idle {key.name}")
            self._tell_directory("register", key.name, self._actor_id)

    # runs ---------------------------------------------------------------------------------

    async def _drive_run(self) -> RunStatus:
        try:
            run = await self._runtime.drive_run(self._key.org_id, self._key.id)
        except Exception:
            # The run stays RUNNING with its ledger intact; the directory tries again.
            log.exception("%s: driving stopped with an error", self._key.name)
            raise
        finally:
            self._spawn(self._retire())
        if run.status is RunStatus.RUNNING:  # pragma: no cover - drive_run always ends it
            raise RuntimeError(f"{self._key.name}: drive_run returned a RUNNING run")
        return run.status

    async def wait(self) -> RunStatus:
        """The run's terminal status, once reached (raises what stopped the drive)."""
        if self._drive is None:
            raise TypeError(f"{self._key.name} is not a run")
        return await asyncio.shield(self._drive)

    # sessions -----------------------------------------------------------------------------

    async def turn(self, caller: Principal, message: str) -> AsyncIterator[TurnEvent | TurnResult]:
        """One turn, streamed: its events as they happen, then its ``TurnResult`` last.

        Turns queue behind each other up to ``max_pending_turns``. The turn runs to its end
        even if the caller stops listening (it is then in the history)."""
        if self._closing:
            raise _SessionPassivating(self._key.name)
        if self._pending >= self._policy.max_pending_turns:
            raise SessionBusyError(
                f"session {self._key.id} already has {self._pending} turn(s) running or "
                f"queued (limit {self._policy.max_pending_turns}); try again when it answers"
            )
        self._pending += 1
        self._last_used = time.monotonic()
        events: asyncio.Queue[TurnEvent] = asyncio.Queue()
        running = asyncio.create_task(self._run_turn(caller, message, events.put_nowait))
        self._background.add(running)
        running.add_done_callback(self._background.discard)
        async for event in events_until(running, events):
            yield event
        yield await running

    async def _run_turn(
        self, caller: Principal, message: str, on_event: Callable[[TurnEvent], None]
    ) -> TurnResult:
        try:
            async with self._lock:
                session = await self._runtime.store.get_session(self._key.org_id, self._key.id)
                return await self._runtime.run_turn(session, caller, message, on_event=on_event)
        finally:
            self._pending -= 1
            self._last_used = time.monotonic()
            self._tell_directory("touch", self._key.name, self._actor_id)

    async def end(self) -> list[MemoryRecord]:
        """End the session (the extraction pass runs), then passivate."""
        if self._closing:
            raise _SessionPassivating(self._key.name)
        self._pending += 1
        try:
            async with self._lock:
                session = await self._runtime.store.get_session(self._key.org_id, self._key.id)
                facts = await self._runtime.end_session(session)
        finally:
            self._pending -= 1
        await self.passivate()
        return facts

    async def passivate(self) -> bool:
        """Leave if idle: ``True`` when the actor is going away, ``False`` when it is busy."""
        if self._closing:
            return True
        if self._pending or self._drive is not None:
            return False
        self._closing = True  # from here on turns are refused unrun, and retried elsewhere
        self._spawn(self._retire())
        return True

    async def status(self) -> dict[str, Any]:
        """What the directory asks when it rebuilds its view of the cluster."""
        return {
            "name": self._key.name,
            "actor_id": self._actor_id,
            "idle_s": time.monotonic() - self._last_used,
            "pending": self._pending,
            "closing": self._closing,
        }

    async def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()

    # lifecycle ----------------------------------------------------------------------------

    async def _idle_watch(self) -> None:
        timeout = self._policy.idle_timeout_s
        while not self._closing:
            idle = time.monotonic() - self._last_used
            if idle < timeout or self._pending:
                await asyncio.sleep(max(timeout - idle, min(timeout, 1.0) / 4))
                continue
            log.info("%s: idle for %.1f s, passivating", self._key.name, idle)
            await self.passivate()
            return

    async def _retire(self) -> None:
        """Close what the actor holds, tell the directory, and exit (an intended exit)."""
        self._closing = True
        if self._idle is not None and self._idle is not asyncio.current_task():
            self._idle.cancel()
        if self._key.kind == "session":
            await self._notify_directory("unregister", self._key.name, self._actor_id)
        try:
            await self._runtime.close()
        except Exception:
            log.exception("%s: closing the runtime failed", self._key.name)
        # Let in-flight notes to the directory land before the process goes.
        pending = [t for t in self._background if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        # exit_actor() must run inside an actor task to end the process; calls already
        # running complete first, queued ones fail with ActorDiedError (INTENDED_USER_EXIT).
        me = ray.get_runtime_context().current_actor
        me._exit.remote()

    async def _exit(self) -> None:
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _tell_directory(self, method: str, *args: Any) -> None:
        """Fire-and-forget note to the directory."""
        self._spawn(self._notify_directory(method, *args))

    async def _notify_directory(self, method: str, *args: Any) -> None:
        # The directory being away (restarting, not yet created) is not an error: it
        # rebuilds its view from the cluster when it comes back.
        try:
            directory = ray.get_actor(DIRECTORY_NAME, namespace=self._policy.namespace)
            await asyncio.wait_for(getattr(directory, method).remote(*args), timeout=5.0)
        except (RayError, ValueError, TimeoutError) as exc:  # ValueError: no such actor
            log.debug("%s: directory.%s failed: %s", self._key.name, method, exc)
