"""The ``AgentSession`` actor: one per live session or task run, found by name.

Everything it knows is in PostgreSQL, so it can stop at any time and come back:

- a **run** actor drives its run from the constructor (``Runtime.drive_run`` continues after
  the last recorded step), so a restart by Ray (``max_restarts=-1``) resumes the run, and it
  exits when the run reaches a terminal state;
- a **session** actor serves turns one at a time, passivates (exits) after
  ``idle_timeout_s`` without a turn or when the directory evicts it, and is created again by
  the next message;
- a **warm** actor (``key=None``) has its imports done and its ``Runtime`` open but no
  session yet: the directory keeps ``SessionPolicy.warm_actors`` of them and binds one to a
  session that needs an actor (:meth:`AgentSession.adopt`), so bringing a passivated session
  back costs one call instead of a process start. Its name (``cortex-ray:warm/<uuid>``)
  stays: the directory maps the session's key to it.

Its ``repr`` (the ``repr_name`` in Ray's dashboard) names the organisation, the agent and the
run or session; Ray records it once, when the constructor returns, so a warm actor stays
``AgentSession(warm)`` there (docs/operations.md, "Where to look").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
import uuid
from typing import Any, cast

import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import RayError

from actors._exceptions import _SessionPassivating
from actors._factory import RuntimeFactory
from actors._metrics import install_ray_metrics
from actors._naming import DIRECTORY_NAME, ActorKey
from actors._session_turns import TurnServing
from cortex_ray import (
    MemoryRecord,
    RunStatus,
    Runtime,
    SessionPolicy,
    Settings,
    TurnResult,
)
from cortex_ray.observability import metrics

__all__ = ["WARM_PREFIX", "AgentSession", "create_warm", "get_or_create"]

WARM_PREFIX = "cortex-ray:warm/"
"""Names of warm actors: ``cortex-ray:warm/<uuid>`` (no actor key parses to one)."""

log = logging.getLogger("actors.session")


def get_or_create(
    key: ActorKey, settings: Settings, factory: RuntimeFactory, policy: SessionPolicy
) -> ActorHandle[Any]:
    """The live actor for ``key``, created if there is none (one name, one actor)."""
    actor_class = cast("ActorClass[Any]", AgentSession)
    handle = actor_class.options(
        **_OPTIONS, **placement(policy), name=key.name, namespace=policy.namespace
    ).remote(key, settings, factory, policy)
    return cast("ActorHandle[Any]", handle)


def create_warm(
    settings: Settings, factory: RuntimeFactory, policy: SessionPolicy
) -> ActorHandle[Any]:
    """A new warm (unbound) session actor; it is ready when its ``status`` answers."""
    actor_class = cast("ActorClass[Any]", AgentSession)
    options = {
        **_OPTIONS,
        "get_if_exists": False,
        # Restarted, it would come back unbound (the constructor's arguments hold no key);
        # a dead warm or adopted actor is replaced by the directory instead.
        "max_restarts": 0,
    }
    name = f"{WARM_PREFIX}{uuid.uuid4()}"
    handle = actor_class.options(
        **options, **placement(policy), name=name, namespace=policy.namespace
    ).remote(None, settings, factory, policy)
    return cast("ActorHandle[Any]", handle)


def placement(policy: SessionPolicy) -> dict[str, Any]:
    """The scheduling options the policy asks for: ``label_selector`` when it names node
    labels (session actors and the directory stay on, say, CPU nodes), else none."""
    return {"label_selector": dict(policy.label_selector)} if policy.label_selector else {}


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


def _release_free_heap() -> None:
    """Hand the heap pages freed by the imports and ``Runtime.open`` back to the kernel
    (glibc keeps them otherwise): each live actor is a process, so its private memory is
    what a live session costs."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@ray.remote
class AgentSession(TurnServing):
    """The actor for one :class:`~actors.ActorKey` (a run or a session), or a warm one
    (``key=None``) waiting to adopt a session."""

    async def __init__(  # type: ignore[misc]  # Ray awaits an async constructor
        self,
        key: ActorKey | None,
        settings: Settings,
        factory: RuntimeFactory,
        policy: SessionPolicy,
    ) -> None:
        self._key: ActorKey | None = key
        self._agent: str | None = None  # the agent's name, once read: what __repr__ shows
        self._policy = policy
        self._actor_id: str = ray.get_runtime_context().get_actor_id() or ""
        self._closing = False
        self._pending = 0  # turns admitted: running + waiting for the lock
        self._lock = asyncio.Lock()  # FIFO: one turn at a time, in order of admission
        self._last_used = time.monotonic()
        self._background: set[asyncio.Task[Any]] = set()
        self._turns: dict[uuid.UUID, asyncio.Task[TurnResult]] = {}  # in flight, by turn id
        self._retiring = asyncio.Event()
        self._reactivation: bool | None = None  # known at the first turn
        install_ray_metrics()
        self._runtime: Runtime = await factory(settings)
        _release_free_heap()
        self._drive: asyncio.Task[RunStatus] | None = None
        self._idle: asyncio.Task[None] | None = None
        if key is None:
            return  # warm: waits for adopt(); the directory that created it knows it
        # Before the constructor returns: Ray records repr(self) then, and only then.
        self._agent = await self._agent_name(key)
        if key.kind == "run":
            # Resume (or begin) at once: after a crash Ray re-runs this constructor.
            self._drive = asyncio.create_task(self._drive_run(), name=f"drive {key.name}")
        else:
            self._idle = asyncio.create_task(self._idle_watch(), name=f"idle {key.name}")
            self._tell_directory("register", key.name, self._actor_id)
            if ray.get_runtime_context().was_current_actor_reconstructed:
                # Restarted by Ray after a crash: the turns it held are driven again now
                # (their leases are in this name), not once they expire.
                self._spawn(self._recover_held_turns(key))

    def __repr__(self) -> str:
        """What Ray's dashboard shows as the actor's ``repr_name`` (and ``ray list actors
        --detail``): the organisation, the agent and the run or session. Ray records it once,
        when the constructor returns; a warm actor is recorded as ``AgentSession(warm)`` and
        stays so after it adopts a session (its ``status`` then names both)."""
        key = getattr(self, "_key", None)
        if key is None:
            return "AgentSession(warm)"
        agent = getattr(self, "_agent", None) or "?"
        return f"AgentSession(org={key.org_id} agent={agent} {key.kind}={key.id})"

    async def _agent_name(self, key: ActorKey) -> str | None:
        """The name of the agent ``key``'s run or session belongs to; ``None`` when it cannot
        be read (a name for the dashboard never stops an actor: the run or turn reports
        what is wrong)."""
        try:
            return await self._runtime.store.agent_name_of(key.org_id, key.kind, key.id)
        except Exception as exc:
            log.debug("%s: its agent's name could not be read: %s", key.name, exc)
            return None

    @property
    def _bound(self) -> ActorKey:
        """The key of a session or run actor; a warm one refuses (retried elsewhere)."""
        if self._key is None:
            raise _SessionPassivating("a warm actor serves no session yet")
        return self._key

    async def adopt(self, key: ActorKey, policy: SessionPolicy | None = None) -> str:
        """Bind this warm actor to ``key`` (a session) under ``policy`` (its idle timeout and
        queue bound; default: the one it was started with); returns its actor id. Only the
        directory calls it, under its lock, so a key is never adopted twice."""
        if self._key is not None or self._closing:
            raise _SessionPassivating(f"cannot adopt {key.name}: the actor is taken or leaving")
        if key.kind != "session":
            raise TypeError(f"only sessions are adopted, not {key.name}")
        if policy is not None and policy.namespace == self._policy.namespace:
            self._policy = policy
        self._key = key
        self._last_used = time.monotonic()
        self._idle = asyncio.create_task(self._idle_watch(), name=f"idle {key.name}")
        self._spawn(self._learn_agent(key))  # off the adoption's path: for status()
        return self._actor_id

    async def _learn_agent(self, key: ActorKey) -> None:
        self._agent = await self._agent_name(key)

    async def lifetime(self) -> None:
        """Returns when the actor starts to leave (raises if it dies): the directory waits
        on it to forget an actor the moment it goes."""
        await self._retiring.wait()

    # runs ---------------------------------------------------------------------------------

    async def _drive_run(self) -> RunStatus:
        key = self._bound
        try:
            # The actor's name is its lease owner: restarted by Ray (same name), it takes
            # its own lease again at once instead of waiting for it to expire.
            run = await self._runtime.drive_run(key.org_id, key.id, owner=key.name)
        except Exception:
            # The run stays RUNNING with its ledger intact; the directory tries again.
            log.exception("%s: driving stopped with an error", key.name)
            raise
        finally:
            self._spawn(self._retire())
        if run.status is RunStatus.RUNNING:
            # Another driver holds the run's lease (a `runs resume`, another cluster's
            # supervisor): it goes on; this actor leaves. RUNNING tells the directory so.
            log.info("%s: another driver holds the run; not driven here", key.name)
        return run.status

    async def wait(self) -> RunStatus:
        """The run's terminal status, once reached (raises what stopped the drive);
        RUNNING when another driver holds the run."""
        if self._drive is None:
            raise TypeError(f"{self._bound.name} is not a run")
        return await asyncio.shield(self._drive)

    # sessions -----------------------------------------------------------------------------

    async def end(self) -> list[MemoryRecord]:
        """End the session (the extraction pass runs), then passivate."""
        key = self._bound
        if self._closing:
            raise _SessionPassivating(key.name)
        self._pending += 1
        try:
            # The turns in flight here end first (once it has ended they would be refused).
            await asyncio.gather(*self._turns.values(), return_exceptions=True)
            async with self._lock:
                session = await self._runtime.store.get_session(key.org_id, key.id)
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
        self._passivating()
        self._spawn(self._retire())
        return True

    async def status(self) -> dict[str, Any]:
        """What the directory asks when it rebuilds its view of the cluster."""
        return {
            "name": None if self._key is None else self._key.name,  # None: warm
            "agent": self._agent,  # the agent's name (None: warm, or not read yet)
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
            log.info("%s: idle for %.1f s, passivating", self._bound.name, idle)
            await self.passivate()
            return

    def _passivating(self) -> None:
        if self._key is not None and self._key.kind == "session":
            metrics.record(metrics.SESSION_PASSIVATIONS, namespace=self._policy.namespace)

    async def _retire(self) -> None:
        """Close what the actor holds, tell the directory, and exit (an intended exit)."""
        self._closing = True
        self._retiring.set()
        name = "warm actor" if self._key is None else self._key.name
        if self._idle is not None and self._idle is not asyncio.current_task():
            self._idle.cancel()
        if self._key is not None and self._key.kind == "session":
            await self._notify_directory("unregister", self._key.name, self._actor_id)
        try:
            await self._runtime.close()
        except Exception:
            log.exception("%s: closing the runtime failed", name)
        # Let in-flight notes to the directory land before the process goes.
        pending = [t for t in self._background if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=self._policy.drain_timeout_s)
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
            await asyncio.wait_for(
                getattr(directory, method).remote(*args),
                timeout=self._policy.directory_call_timeout_s,
            )
        except (RayError, ValueError, TimeoutError) as exc:  # ValueError: no such actor
            log.debug("%s: directory.%s failed: %s", self._key, method, exc)
