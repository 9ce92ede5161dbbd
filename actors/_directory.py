"""The directory: the one supervisor of a namespace's session and run actors.

It follows Ray Serve's controller: its GOAL state is small and durable (the policy and the
runtime recipe, held by Ray as its constructor arguments; which runs should be driven, held
by PostgreSQL as their RUNNING status) and its CURRENT state is rebuilt by asking the
cluster (the named actors alive in the namespace) whenever it starts or restarts.

- **Live cap.** Session actors register when they start and touch it after every turn;
  when more than ``max_live_sessions`` are live it asks the least recently used to
  passivate, skipping busy ones (the cap is soft: if every session is busy, none is evicted).
- **Which actor serves a session.** ``acquire`` maps a session's key to its actor: the one
  already bound, else a warm actor it binds (``adopt``), else a new actor named after the
  key (the cold path, when the pool is empty). It is the only place that binds keys, under
  one lock, so a key never has two actors; it keeps ``warm_actors`` warm actors started and
  watches every session actor's ``lifetime`` to forget it the moment it leaves or dies.
- **Runs.** ``drive_run`` creates the run's actor and watches it until the run is terminal:
  if the actor dies for good (``ray.kill``, a node lost) while the run is still RUNNING in
  PostgreSQL, it creates a new one, which resumes after the last recorded step. Crashes
  that Ray restarts itself (``max_restarts=-1``) resume in the restarted constructor. The
  actor drives under the run's lease, owned by its name: a restarted actor takes it back at
  once; a run another driver holds is left to it (the watcher ends, RUNNING), and the
  API's supervisor (``cortex_ray.RunSupervisor``) hands it back here if that driver stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import Any, cast
from uuid import UUID

import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

from actors._exceptions import SessionError
from actors._factory import RuntimeFactory
from actors._metrics import install_ray_metrics
from actors._naming import DIRECTORY_NAME, ActorKey
from actors._run_watch import RunWatch, cause_of
from actors._session import WARM_PREFIX, create_warm, get_or_create, placement
from cortex_ray import RunStatus, SessionPolicy, Settings
from cortex_ray.observability import metrics
from cortex_ray.storage import Database, Store, TurnStore

__all__ = ["SessionDirectory", "get_or_create_directory"]

log = logging.getLogger("actors.directory")

Bound = tuple[ActorHandle[Any], str]
"""A session actor's handle and its actor id (which tells successors with one name apart)."""


def actor_id_of(handle: ActorHandle[Any]) -> str:
    """The actor id of a handle (the id ``get_runtime_context().get_actor_id()`` gives)."""
    return str(handle._actor_id.hex())


@ray.remote
class SessionDirectory(RunWatch):
    """Supervises the session and run actors of one namespace (named ``DIRECTORY_NAME``)."""

    async def __init__(  # type: ignore[misc]  # Ray awaits an async constructor
        self, settings: Settings, factory: RuntimeFactory, policy: SessionPolicy
    ) -> None:
        self._settings = settings
        self._factory = factory
        self._policy = policy
        # A small pool: the directory only reads run statuses.
        self._db = await Database.open(
            settings.storage.model_copy(update={"pool_min_size": 1, "pool_max_size": 2})
        )
        self._store = Store(self._db)
        self._turns = TurnStore(self._db)
        self._sessions: OrderedDict[str, str] = OrderedDict()  # name → actor id, LRU first
        self._bound: dict[str, Bound] = {}  # session name → the actor serving it
        self._warm: deque[Bound] = deque()  # started, unbound, oldest first
        self._starting = 0  # warm actors being started
        self._watched: set[str] = set()  # actor ids whose lifetime is watched
        self._serving: dict[str, str] = {}  # actor id → the session name it serves
        self._binding = asyncio.Lock()
        self._watchers: dict[str, asyncio.Task[RunStatus | None]] = {}
        self._evicting = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        # The warm pool starts with the first session that needs an actor (a namespace that
        # only drives runs never pays for it).
        await self._rebuild()
        install_ray_metrics()
        self._spawn(self._report())

    async def _report(self, every_s: float = 5.0) -> None:
        """The live and warm session actors as gauges, every few seconds."""
        namespace = self._policy.namespace
        while True:
            metrics.record(
                metrics.SESSION_ACTORS, len(self._sessions), namespace=namespace, state="live"
            )
            metrics.record(
                metrics.SESSION_ACTORS, len(self._warm), namespace=namespace, state="warm"
            )
            await asyncio.sleep(every_s)

    async def _rebuild(self) -> None:
        """Current state from the cluster: the named actors alive in our namespace."""
        names = [
            entry["name"]
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == self._policy.namespace
        ]
        sessions: list[tuple[float, str, str]] = []
        for name in names:
            key = ActorKey.parse(name)
            if key is None and not name.startswith(WARM_PREFIX):
                continue
            if key is not None and key.kind == "run":
                self._watch(key)
                continue
            try:
                handle = ray.get_actor(name, namespace=self._policy.namespace)
                status: dict[str, Any] = await asyncio.wait_for(
                    handle.status.remote(), timeout=self._policy.status_timeout_s
                )
            except (RayActorError, ValueError, TimeoutError):
                continue
            if status["closing"]:
                continue
            actor_id = status["actor_id"]
            self._watch_lifetime(handle, actor_id)
            if status["name"] is None:  # warm, unbound
                self._warm.append((handle, actor_id))
                continue
            # A session actor: named after its key, or a warm one that adopted it.
            self._bound[status["name"]] = (handle, actor_id)
            self._serving[actor_id] = status["name"]
            sessions.append((status["idle_s"], status["name"], actor_id))
        for _, name, actor_id in sorted(sessions, reverse=True):  # most idle first = LRU
            self._sessions[name] = actor_id
        if names:
            log.info(
                "directory rebuilt: %d live sessions, %d runs watched",
                len(self._sessions),
                len(self._watchers),
            )
        self._spawn(self._evict())

    # sessions -----------------------------------------------------------------------------

    async def register(self, name: str, actor_id: str) -> None:
        self._sessions[name] = actor_id
        self._sessions.move_to_end(name)
        if len(self._sessions) > self._policy.max_live_sessions:
            self._spawn(self._evict())

    async def touch(self, name: str, actor_id: str) -> None:
        if self._sessions.get(name) == actor_id:
            self._sessions.move_to_end(name)
        elif name not in self._sessions:
            await self.register(name, actor_id)

    async def unregister(self, name: str, actor_id: str) -> None:
        # Only the actor that registered may leave: a note from a passivated actor may land
        # after its successor (same name) registered.
        if self._sessions.get(name) == actor_id:
            del self._sessions[name]
        self._forget_actor(name, actor_id)

    async def acquire(
        self,
        org_id: str,
        session_id: UUID,
        stale: str | None = None,
        policy: SessionPolicy | None = None,
    ) -> Bound:
        """The actor that serves the session (bound now if none is): its handle and id.

        ``stale``: the actor id a caller found leaving or dead; it is not handed out again.
        ``policy``: the caller's (its idle timeout and queue bound go with a new binding, as
        when the caller created the actor itself); default: the directory's.
        """
        key = ActorKey.session(org_id, session_id)
        policy = policy or self._policy
        async with self._binding:
            bound = self._bound.get(key.name)
            if bound is not None and bound[1] != stale:
                return bound
            self._forget_actor(key.name, stale)
            chosen = self._named(key) or await self._adopt(key, policy) or self._create(key, policy)
            self._bound[key.name] = chosen
            self._serving[chosen[1]] = key.name
        if len(self._warm) + self._starting < self._policy.warm_actors:
            self._spawn(self._fill_pool())
        return chosen

    async def lookup(self, name: str) -> ActorHandle[Any] | None:
        """The live actor bound to a session name, if any (binds nothing)."""
        bound = self._bound.get(name)
        return None if bound is None else bound[0]

    async def forget(self, name: str, actor_id: str) -> None:
        """A caller saw this actor die: stop handing it out."""
        self._forget_actor(name, actor_id)
        if self._sessions.get(name) == actor_id:
            del self._sessions[name]

    async def warm_actors(self) -> list[str]:
        """Actor ids of the warm (unbound) actors, oldest first."""
        return [actor_id for _, actor_id in self._warm]

    def _named(self, key: ActorKey) -> Bound | None:
        # An actor named after the key (the cold path, or one this directory has not heard
        # of yet, e.g. restarting while the view was rebuilt) keeps the key: never adopt then.
        try:
            handle = ray.get_actor(key.name, namespace=self._policy.namespace)
        except ValueError:
            return None
        bound = (handle, actor_id_of(handle))
        self._watch_lifetime(*bound)
        return bound

    async def _adopt(self, key: ActorKey, policy: SessionPolicy) -> Bound | None:
        while self._warm:
            handle, actor_id = self._warm.popleft()
            try:
                await asyncio.wait_for(
                    handle.adopt.remote(key, policy),
                    timeout=self._policy.directory_call_timeout_s,
                )
            except (RayActorError, SessionError, TimeoutError) as exc:
                log.info("warm actor %s could not adopt %s: %s", actor_id, key.name, exc)
                continue
            await self.register(key.name, actor_id)
            return handle, actor_id
        return None

    def _create(self, key: ActorKey, policy: SessionPolicy) -> Bound:
        # No warm actor left: a new one named after the key (it registers when started).
        handle = get_or_create(key, self._settings, self._factory, policy)
        bound = (handle, actor_id_of(handle))
        self._watch_lifetime(*bound)
        return bound

    def _forget_actor(self, name: str, actor_id: str | None) -> None:
        bound = self._bound.get(name)
        if bound is not None and actor_id is not None and bound[1] == actor_id:
            del self._bound[name]

    async def _fill_pool(self) -> None:
        """Start warm actors, one at a time, until ``warm_actors`` are ready."""
        while len(self._warm) + self._starting < self._policy.warm_actors:
            self._starting += 1
            try:
                handle = create_warm(self._settings, self._factory, self._policy)
                status: dict[str, Any] = await handle.status.remote()  # constructor done
            except RayActorError as exc:
                log.warning("a warm actor failed to start: %s", cause_of(exc))
                await asyncio.sleep(1.0)  # a factory that fails keeps failing: no busy loop
                return
            finally:
                self._starting -= 1
            self._warm.append((handle, status["actor_id"]))
            self._watch_lifetime(handle, status["actor_id"])

    def _watch_lifetime(self, handle: ActorHandle[Any], actor_id: str) -> None:
        if actor_id not in self._watched:
            self._watched.add(actor_id)
            self._spawn(self._follow(handle, actor_id))

    async def _follow(self, handle: ActorHandle[Any], actor_id: str) -> None:
        """Wait on an actor's ``lifetime``; when it leaves or dies, forget it everywhere; when
        it died serving a session, have that session's turns driven again at once."""
        died = False
        try:
            while True:
                try:
                    await handle.lifetime.remote()
                    break  # leaving on purpose
                except ActorUnavailableError:
                    await asyncio.sleep(0.5)  # restarting (a named actor): same key, same id
                except RayActorError:
                    died = True
                    break
        finally:
            self._watched.discard(actor_id)
        serving = self._serving.pop(actor_id, None)
        if died and serving is not None:
            self._spawn(self._recover_turns(serving, actor_id))
        self._warm = deque(w for w in self._warm if w[1] != actor_id)
        for name, bound in list(self._bound.items()):
            if bound[1] == actor_id:
                del self._bound[name]
                if self._sessions.get(name) == actor_id:
                    del self._sessions[name]
        if len(self._warm) + self._starting < self._policy.warm_actors:
            await self._fill_pool()

    async def _recover_turns(self, name: str, dead: str) -> None:
        """The actor serving session ``name`` died (Ray says so at once): the turns it held
        are driven again now by its successor, which takes their leases back (they are held
        in the session's name), instead of once they expire and the supervisor sweeps."""
        key = ActorKey.parse(name)
        if key is None or key.kind != "session":
            return
        try:
            turn_ids = await self._turns.resumable(key.org_id, key.id, key.name)
        except Exception as exc:  # the supervisor recovers them once their leases expire
            log.warning("%s: its turns could not be read to recover them: %s", name, exc)
            return
        if not turn_ids:
            return
        deadline = time.monotonic() + self._policy.reactivation_timeout_s
        stale = dead
        while True:
            actor_id = stale
            try:
                handle, actor_id = await self.acquire(key.org_id, key.id, stale)
                for turn_id in turn_ids:
                    await asyncio.wait_for(
                        handle.recover_turn.remote(turn_id),
                        timeout=self._policy.directory_call_timeout_s,
                    )
            except Exception as exc:  # restarting, leaving, slow: ask again, for a while
                if time.monotonic() > deadline:
                    log.warning("%s: its turns were left to the supervisor: %s", name, exc)
                    return
                stale = actor_id
                await asyncio.sleep(0.2)
                continue
            log.info(
                "%s: its actor %s died; %d turn(s) driven again at once by %s",
                name, dead, len(turn_ids), actor_id,
            )  # fmt: skip
            return

    async def live_sessions(self) -> list[str]:
        """Names of the live session actors, least recently used first."""
        return list(self._sessions)

    async def _evict(self) -> None:
        async with self._evicting:
            while len(self._sessions) > self._policy.max_live_sessions:
                if not await self._evict_one():
                    log.warning(
                        "%d live sessions, cap %d: every candidate is busy; over the cap for now",
                        len(self._sessions),
                        self._policy.max_live_sessions,
                    )
                    return

    async def _evict_one(self) -> bool:
        newest = next(reversed(self._sessions))
        for name, actor_id in list(self._sessions.items()):
            if name == newest:
                break
            bound = self._bound.get(name)
            try:
                if bound is None:
                    handle = ray.get_actor(name, namespace=self._policy.namespace)
                else:
                    handle = bound[0]
                going: bool = await asyncio.wait_for(
                    handle.passivate.remote(), timeout=self._policy.passivate_timeout_s
                )
            except (RayActorError, ValueError, TimeoutError):
                going = True  # already gone (or unreachable): not live
            if going:
                if self._sessions.get(name) == actor_id:
                    del self._sessions[name]
                log.info("evicted %s (live cap %d)", name, self._policy.max_live_sessions)
                return True
        return False

    # housekeeping -------------------------------------------------------------------------

    async def ping(self) -> float:
        return time.time()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def get_or_create_directory(
    settings: Settings, factory: RuntimeFactory, policy: SessionPolicy
) -> ActorHandle[Any]:
    """The namespace's directory, created on first use (detached, restarted after crashes)."""
    actor_class = cast("ActorClass[Any]", SessionDirectory)
    handle = actor_class.options(
        name=DIRECTORY_NAME,
        namespace=policy.namespace,
        get_if_exists=True,
        lifetime="detached",
        max_restarts=-1,
        num_cpus=0,
        **placement(policy),
    ).remote(settings, factory, policy)
    return cast("ActorHandle[Any]", handle)
