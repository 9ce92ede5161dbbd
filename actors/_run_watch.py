"""The directory's run half: ``drive_run`` creates a run's actor and watches it until the run
is terminal, creating a new one when the actor dies for good while the run is still RUNNING
in PostgreSQL (see ``actors._directory`` for the whole supervisor)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from typing import Any
from uuid import UUID

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors._factory import RuntimeFactory
from actors._naming import ActorKey
from actors._session import get_or_create
from cortex_ray import NotFoundError, RunStatus, SessionPolicy, Settings
from cortex_ray.storage import Store

__all__ = ["RunWatch", "cause_of"]

log = logging.getLogger("actors.directory")


class RunWatch:
    """The run watchers of the directory (a part of ``SessionDirectory``, which sets the
    attributes below in its constructor)."""

    _settings: Settings
    _factory: RuntimeFactory
    _policy: SessionPolicy
    _store: Store
    _watchers: dict[str, asyncio.Task[RunStatus | None]]

    async def drive_run(self, org_id: str, run_id: UUID) -> None:
        """Make sure the run is being driven (creates its actor); returns at once."""
        self._watch(ActorKey.run(org_id, run_id))

    async def wait_run(self, org_id: str, run_id: UUID) -> RunStatus:
        """The run's status once its watcher stops: terminal (FAILED when it gave up), or
        RUNNING when not even the failure could be recorded."""
        key = ActorKey.run(org_id, run_id)
        watcher = self._watch(key)
        status = await asyncio.shield(watcher)
        if status is None:
            return (await self._store.get_run(org_id, run_id)).status
        return status

    async def watched_runs(self) -> list[str]:
        return [name for name, task in self._watchers.items() if not task.done()]

    def _watch(self, key: ActorKey) -> asyncio.Task[RunStatus | None]:
        watcher = self._watchers.get(key.name)
        if watcher is None or watcher.done():
            watcher = asyncio.create_task(self._watch_run(key), name=f"watch {key.name}")
            self._watchers[key.name] = watcher
            watcher.add_done_callback(functools.partial(self._forget, key.name))
        return watcher

    def _forget(self, name: str, task: asyncio.Task[Any]) -> None:
        if self._watchers.get(name) is task:
            del self._watchers[name]

    async def _watch_run(self, key: ActorKey) -> RunStatus | None:
        failures = 0  # attempts in a row that ended in an error (constructor or drive)
        losses = 0  # actors in a row that died without the run recording a step
        steps_seen = -1
        last_error = "none"
        while True:
            try:
                run = await self._store.get_run(key.org_id, key.id)
            except NotFoundError:
                log.warning("%s: no such run; not driving it", key.name)
                return None
            if run.status is not RunStatus.RUNNING:
                return run.status
            if len(run.steps) != steps_seen:  # progress: earlier errors were not in a row
                steps_seen, failures, losses = len(run.steps), 0, 0
            if failures > self._policy.run_retry_limit:
                reason = (
                    f"gave up after {failures} failed attempts in a row to drive the run "
                    f"(last: {last_error})"
                )
                log.error("%s: %s", key.name, reason)
                try:
                    await self._store.fail_run(key.org_id, key.id, reason)
                except Exception:
                    log.exception("%s: recording the failure failed; it stays RUNNING", key.name)
                    return None
                continue  # the next look at PostgreSQL sees it terminal
            # Get-or-create: a live (or restarting) actor is reused, a dead one replaced.
            handle = get_or_create(key, self._settings, self._factory, self._policy)
            try:
                status: RunStatus = await handle.wait.remote()
                if status is RunStatus.RUNNING:
                    # Another driver holds the run's lease (``runs resume``, another
                    # process): it drives it; if it stops, the supervisor hands it back.
                    log.info("%s: driven elsewhere; not watched here", key.name)
                    return status
                continue  # terminal: the next look at PostgreSQL says so
            except ActorUnavailableError:
                # Restarting after a crash (Ray re-runs the constructor, which resumes the
                # run); calls fail fast until it is back, so poll at a steady pace.
                await asyncio.sleep(0.1)
                continue
            except ActorDiedError as exc:
                if not exc.actor_init_failed:
                    # Killed for good, or exited: a new actor (same name) resumes the run.
                    # Dying again and again without progress is slowed, not given up on.
                    log.info("%s: actor died; resuming in a new one", key.name)
                    losses += 1
                    if losses > 1:
                        await asyncio.sleep(min(2.0, 0.05 * 2**losses))
                    continue
                failures += 1  # the constructor failed (database, factory)
                last_error = f"the actor failed to start: {cause_of(exc)}"
                log.warning("%s: actor failed to start: %s", key.name, exc)
                # Its worker lingers until what it started has drained (a Serve handle's
                # long polls: 30-60 s) and keeps the name meanwhile, so the next attempt
                # would wait for it: end it now.
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as kill_error:  # gone already: nothing to end
                    log.debug("%s: %s", key.name, kill_error)
            except Exception as exc:
                failures += 1  # the drive itself raised (model or database error)
                last_error = cause_of(exc)
                log.warning("%s: drive failed (%d in a row): %s", key.name, failures, exc)
            await asyncio.sleep(min(self._policy.run_retry_backoff_max_s, 0.25 * 2**failures))


_RAISED = re.compile(r"^\s*[\w.]*(Error|Exception)\b[^:]*: .+")


def cause_of(exc: BaseException) -> str:
    """The line that says what went wrong: Ray wraps an actor's exception in its traceback,
    whose last ``SomeError: message`` line is the original error."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    line = raised[-1] if raised else (lines[0] if lines else type(exc).__name__)
    return line[:300]
