"""``SessionManager``: cortex-ray's ``Executor`` on Ray actors (what the HTTP API calls)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from actors._directory import Bound, get_or_create_directory
from actors._exceptions import SessionUnavailableError, _SessionPassivating
from actors._factory import RuntimeFactory, open_runtime
from actors._naming import ActorKey
from cortex_ray import (
    ConfigurationError,
    CortexError,
    MemoryRecord,
    Principal,
    RunStatus,
    Runtime,
    SessionPolicy,
    Settings,
    TurnEventRelay,
    TurnEventSink,
    TurnResult,
)

__all__ = ["SessionManager"]

log = logging.getLogger("actors.manager")

_T = TypeVar("_T")

# Ray's wording for an actor that ended itself (ray.actor.exit_actor): ours only do so when
# idle, so a call that met such an actor never ran and is safe to send to its successor.
_INTENDED_EXIT = "INTENDED_USER_EXIT"
_INTENDED_EXIT_STREAMED = "IntentionalSystemExit"


class SessionManager:
    """Runs and sessions in per-key ``AgentSession`` actors; implements ``cortex_ray.Executor``.

    Args:
        settings: what each actor opens its ``Runtime`` from. ``database_url`` must name the
            running PostgreSQL: actors never start the embedded one (see :meth:`for_runtime`).
        factory: opens an actor's ``Runtime`` from ``settings`` (default: everything from the
            settings); pickled into every actor.
        policy: idle timeout, live cap, queue bound and namespace.

    Turns of one session run one at a time in its actor; a turn arriving while
    ``policy.max_pending_turns`` are running or queued fails at once with
    ``SessionBusyError`` (HTTP 409). Runs are driven by their own actor, supervised by the
    namespace's ``SessionDirectory``, which resumes them after a crash.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        factory: RuntimeFactory = open_runtime,
        policy: SessionPolicy | None = None,
    ) -> None:
        if not settings.storage.database_url:
            raise ConfigurationError(
                "session actors need the DSN of a running PostgreSQL "
                "(settings.storage.database_url); they never start the embedded one: use "
                "SessionManager.for_runtime(runtime)"
            )
        self.settings = settings
        self.factory = factory
        self.policy = policy or settings.sessions
        # Which actor serves a session, as the directory said (a session may be served by an
        # adopted warm actor, not found by its name): asked again when that actor is gone.
        self._actors: OrderedDict[str, Bound] = OrderedDict()

    @classmethod
    def for_runtime(
        cls,
        runtime: Runtime,
        *,
        factory: RuntimeFactory = open_runtime,
        policy: SessionPolicy | None = None,
    ) -> SessionManager:
        """A manager whose actors use the database ``runtime`` has open (embedded or not)."""
        # The runtime's process migrated the database: actors only check its version.
        settings = runtime.settings.model_copy(
            update={"database_url": runtime.db.dsn, "migrate": False}
        )
        return cls(settings, factory=factory, policy=policy)

    # the Executor protocol ----------------------------------------------------------------

    async def start_run(self, org_id: str, run_id: UUID) -> None:
        """Have the directory drive the run in its actor; returns once that is arranged."""
        await self.directory().drive_run.remote(org_id, run_id)

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
        """The actor streams the turn's events back as they happen; ``on_event`` hears them
        here, in the caller's process. An accepted turn (``turn_id``) runs to its end in the
        actor even if this call goes away."""
        key = ActorKey.session(org_id, session_id)
        deliver = TurnEventRelay(on_event, key.name)

        async def call(handle: ActorHandle[Any]) -> TurnResult:
            result: TurnResult | None = None
            async for ref in handle.turn.remote(caller, message, turn_id):
                item = await ref
                if isinstance(item, TurnResult):
                    result = item
                else:
                    await deliver(item)
            if result is None:  # pragma: no cover - the actor always ends with the result
                raise SessionUnavailableError(f"session {key.id}: the turn ended without a result")
            return result

        return await self._call_session(key, call)

    async def recover_turn(self, org_id: str, session_id: UUID, turn_id: UUID) -> None:
        """Have the session's actor (created if need be) drive an accepted turn again;
        returns once the actor has it."""

        async def call(handle: ActorHandle[Any]) -> None:
            await handle.recover_turn.remote(turn_id)

        await self._call_session(ActorKey.session(org_id, session_id), call)

    async def end_session(self, org_id: str, session_id: UUID) -> list[MemoryRecord]:
        async def call(handle: ActorHandle[Any]) -> list[MemoryRecord]:
            facts: list[MemoryRecord] = await handle.end.remote()
            return facts

        return await self._call_session(ActorKey.session(org_id, session_id), call)

    # beyond the protocol ------------------------------------------------------------------

    async def wait_run(self, org_id: str, run_id: UUID) -> RunStatus:
        """Wait until the run is terminal (across actor crashes); its final status.

        After ``run_retry_limit`` failed attempts in a row the directory records the run
        FAILED with the last error. RUNNING when another driver holds the run's lease (a
        ``cortex-ray runs resume`` elsewhere): this directory does not drive it then, and
        the holder ends it; or when even FAILED could not be written.
        """
        status: RunStatus = await self.directory().wait_run.remote(org_id, run_id)
        return status

    async def session_actor(self, org_id: str, session_id: UUID) -> ActorHandle[Any] | None:
        """The live actor serving a session, if any (the directory's map: an adopted warm
        actor keeps its own name, so ``ray.get_actor`` by the key's name may not find it)."""
        name = ActorKey.session(org_id, session_id).name
        handle: ActorHandle[Any] | None = await self.directory().lookup.remote(name)
        return handle

    async def passivate(self, org_id: str, session_id: UUID) -> bool:
        """Ask a session's actor to leave now; ``False`` if it is busy. No actor: ``True``."""
        handle = await self.session_actor(org_id, session_id)
        if handle is None:
            return True
        try:
            going: bool = await handle.passivate.remote()
        except RayActorError:
            return True
        return going

    async def live_sessions(self) -> list[str]:
        """Names of the live session actors, least recently used first (the directory's view)."""
        names: list[str] = await self.directory().live_sessions.remote()
        return names

    def directory(self) -> ActorHandle[Any]:
        """The namespace's directory, created on first use (detached, restarted on crashes)."""
        return get_or_create_directory(self.settings, self.factory, self.policy)

    # internals ----------------------------------------------------------------------------

    async def _session_actor(self, key: ActorKey, stale: str | None) -> Bound:
        """The actor serving ``key``: remembered, or bound by the directory (``stale``: the
        actor id just found leaving or dead, never handed out again)."""
        known = self._actors.get(key.name)
        if known is not None and known[1] != stale:
            self._actors.move_to_end(key.name)
            return known
        bound: Bound = await self.directory().acquire.remote(key.org_id, key.id, stale, self.policy)
        self._actors[key.name] = bound
        # Bounded: a long-lived replica sees many sessions; forgetting costs one call.
        while len(self._actors) > 2 * self.policy.max_live_sessions:
            self._actors.popitem(last=False)
        return bound

    def _lost(self, key: ActorKey, actor_id: str) -> None:
        """The actor died under a call: neither this manager nor the directory hands it out."""
        if (known := self._actors.get(key.name)) is not None and known[1] == actor_id:
            del self._actors[key.name]
        self.directory().forget.remote(key.name, actor_id)

    async def _call_session(
        self, key: ActorKey, call: Callable[[ActorHandle[Any]], Awaitable[_T]]
    ) -> _T:
        """Call a session actor, (re)creating it; retried only where nothing ran."""
        deadline = time.monotonic() + self.policy.reactivation_timeout_s
        delay = 0.01
        stale: str | None = None
        while True:
            handle, actor_id = await self._session_actor(key, stale)
            try:
                return await call(handle)
            except _SessionPassivating:
                pass  # refused before running: the actor is on its way out (or warm)
            except RayTaskError as exc:
                # Raised in the actor and re-raised here as RayTaskError(<its class>), whose
                # str is the remote traceback (pid, IP, actor id, colour codes): pass on the
                # actor's own exception, with Ray's chained for the server log.
                if isinstance(exc.cause, CortexError):
                    raise exc.cause from exc
                raise
            except ActorDiedError as exc:
                if exc.actor_init_failed:
                    self._lost(key, actor_id)
                    log.warning("session %s: its actor failed to start: %s", key.id, exc)
                    raise SessionUnavailableError(
                        f"session {key.id}: its actor failed to start; try again later"
                    ) from exc
                if _INTENDED_EXIT not in str(exc):
                    self._lost(key, actor_id)
                    raise SessionUnavailableError(
                        f"session {key.id}: its actor died during the call; it may or may not "
                        "have taken effect"
                    ) from exc
            except ActorUnavailableError as exc:
                # A streamed call (a turn) that meets an actor which ended itself gets this
                # instead of ActorDiedError; ours end themselves only when idle: nothing ran.
                if _INTENDED_EXIT_STREAMED not in str(exc):
                    self._lost(key, actor_id)
                    raise SessionUnavailableError(
                        f"session {key.id}: its actor crashed during the call (Ray restarts "
                        "it); it may or may not have taken effect"
                    ) from exc
            if time.monotonic() > deadline:
                raise SessionUnavailableError(
                    f"session {key.id}: no live actor within {self.policy.reactivation_timeout_s} s"
                )
            stale = actor_id  # leaving: ask for its successor
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
