"""Session and run actors on a real local Ray and the real PostgreSQL, with a scripted model.

The actors open their runtime in their own processes from ``ScriptedRuntime``, a factory
defined here: this module is registered with ``ray.cloudpickle.register_pickle_by_value``, so
the factory (and the model and tool it builds) travel into the workers by value, and Ray
keeps them to re-run an actor's constructor after a crash. The tests share one actor
namespace (one directory) and keep apart by organisation; the live-cap test has its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import sys
import time
import types
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import actors  # noqa: E402
from actors import (  # noqa: E402
    DIRECTORY_NAME,
    ActorKey,
    SessionBusyError,
    SessionManager,
    SessionPolicy,
)
from cortex_ray import (  # noqa: E402
    AgentMode,
    ConfigurationError,
    Executor,
    Grant,
    Principal,
    RunStatus,
    Runtime,
    SessionStatus,
    Settings,
    TurnEvent,
    TurnEventKind,
)
from cortex_ray.act import Tool, ToolContext  # noqa: E402
from cortex_ray.memory import HeuristicImportanceScorer  # noqa: E402
from cortex_ray.models import (  # noqa: E402
    ChatRequest,
    ChatResponse,
    HashEmbedder,
    ScriptedModelClient,
    ToolCall,
)
from cortex_ray.storage import Database  # noqa: E402

# Ship this module's factory, model and tool into Ray workers by value: the workers cannot
# import a test module (pytest puts tests/ on the driver's path only).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

EFFECTS = 3  # the chaos plan: apply e0, e1, e2 (one per step), then finish
STEP = re.compile(r"Step (\d+) of (\d+)\.")


# the factory shipped to the actors ---------------------------------------------------------


def respond(effects: int, request: ChatRequest) -> str:
    """A stateless script: everything it needs is in the prompt (actors restart)."""
    if request.schema_name == "proposals":
        text = "\n".join(m.content or "" for m in request.messages)
        match = STEP.search(text)
        assert match is not None, text
        step = int(match.group(1))  # 1-based
        if step <= effects:
            action = {"tool": "apply_effect", "args": {"name": f"e{step - 1}"}, "rationale": "r"}
        else:
            action = {"finish": True, "message": "all applied", "rationale": "r"}
        return json.dumps({"candidates": [action]})
    if request.schema_name == "facts":
        return json.dumps({"facts": [{"subject": "test session", "fact": "it ended"}]})
    if request.response_schema is not None:
        raise AssertionError(f"unexpected structured call {request.schema_name}")
    said = [m.content or "" for m in request.messages if m.role == "user"]
    if request.tools and said[-1].endswith("what time is it?"):  # a tool round first
        return ChatResponse(tool_calls=(ToolCall(id="c1", name="current_time", arguments="{}"),))
    replies = sum(1 for m in request.messages if m.role == "assistant")
    # The first line only: after a tool round the message is the progress block, whose
    # "[GROUNDING]" copied into a reply is refused as a placeholder (it stands for a value).
    first = said[-1].splitlines()[0] if said[-1] else ""
    return f"echo: {first} (replies seen: {replies})"


class PacedModel(ScriptedModelClient):
    """Answers after ``delay_s`` when the message starts with "slow" (a busy session)."""

    def __init__(self, delay_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    async def chat(self, request: ChatRequest) -> ChatResponse:
        said = [m.content or "" for m in request.messages if m.role == "user"]
        # The message itself, or the tool-results prompt that follows it in the same turn.
        asked = said[-2] if len(said) > 1 and said[-1].startswith("Progress so far") else said[-1]
        if asked.startswith("slow"):
            await asyncio.sleep(self.delay_s)
        return await super().chat(request)


async def apply_effect(holder: dict[str, Database], ctx: ToolContext, args: dict[str, Any]) -> Any:
    """A side effect with an idempotent receiver, as a payment API would be.

    Every call is logged first (``actor_test_invocations``); the effect is applied once per
    idempotency key (``actor_test_effects``); then the reply takes a while to travel back, so
    a kill in that window leaves the effect done and the step unrecorded.
    """
    db = holder["db"]
    key = ctx.idempotency_key
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO actor_test_invocations (idem_key, run_id, effect) VALUES (%s, %s, %s)",
            (key, ctx.run_id, args["name"]),
        )
    async with db.transaction() as conn:
        cur = await conn.execute(
            "INSERT INTO actor_test_effects (idem_key, run_id, effect) VALUES (%s, %s, %s) "
            "ON CONFLICT (idem_key) DO NOTHING",
            (key, ctx.run_id, args["name"]),
        )
        applied = cur.rowcount == 1
    # Long enough that the chaos poller (every 20 ms) reliably lands a kill in this window,
    # even on a loaded 2-core machine.
    await asyncio.sleep(0.4)
    return {"effect": args["name"], "applied": applied}


@dataclass(frozen=True)
class ScriptedRuntime:
    """The runtime factory the actors get: scripted model, hash embedder, the effect tool."""

    effects: int = EFFECTS
    slow_s: float = 1.0

    async def __call__(self, settings: Settings) -> Runtime:
        return await self.open(settings)

    async def open(self, settings: Settings, db: Database | None = None) -> Runtime:
        holder: dict[str, Database] = {}
        tool = Tool(
            name="apply_effect",
            description="Apply a named effect to the outside world (not idempotent).",
            handler=partial(apply_effect, holder),
            parameters={
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
                "additionalProperties": False,
            },
        )
        runtime = await Runtime.open(
            settings,
            model=PacedModel(self.slow_s, responder=partial(respond, self.effects)),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            tools=[tool],
            db=db,
        )
        holder["db"] = runtime.db
        return runtime


# fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def effect_tables(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS actor_test_effects (idem_key text PRIMARY KEY, "
            "run_id uuid NOT NULL, effect text NOT NULL)"
        )
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS actor_test_invocations (id bigserial PRIMARY KEY, "
            "idem_key text NOT NULL, run_id uuid NOT NULL, effect text NOT NULL)"
        )


@pytest.fixture
def actor_settings(settings: Settings, db: Database) -> Settings:
    # Actors reach the test's PostgreSQL by its DSN, each with a small pool.
    return settings.model_copy(update={"database_url": db.dsn, "pool_max_size": 2})


@pytest.fixture
async def local(db: Database, settings: Settings, effect_tables: None) -> AsyncIterator[Runtime]:
    """A runtime in the test process (same tools) to create agents, runs and sessions."""
    runtime = await ScriptedRuntime().open(settings, db=db)
    yield runtime
    await runtime.close(close_db=False)


# One namespace (so one directory) for the module; a test that needs its own live cap
# passes its own. Tests keep apart by organisation.
SHARED = f"test-{uuid.uuid4().hex[:8]}"


def manager(
    actor_settings: Settings, namespace: str = SHARED, slow_s: float = 1.0, **policy: Any
) -> SessionManager:
    return SessionManager(
        actor_settings,
        factory=ScriptedRuntime(slow_s=slow_s),
        policy=SessionPolicy(namespace=namespace, **policy),
    )


async def busy(sessions: SessionManager, org: str, session_id: uuid.UUID) -> bool:
    """The session's actor holds a turn (running or queued)."""
    handle = await sessions.session_actor(org, session_id)
    assert handle is not None
    status: dict[str, Any] = await handle.status.remote()
    return status["pending"] > 0


def live_actors(sessions: SessionManager, org: str, kind: str) -> set[str]:
    """Names of the org's live actors of a kind, asking the cluster (not the directory)."""
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == sessions.policy.namespace and a["name"].startswith(f"{org}/{kind}/")
    }


async def live_sessions(sessions: SessionManager, org: str) -> set[str]:
    """The org's sessions that have a live actor, asking every actor of the namespace (not
    the directory): an adopted warm actor keeps its own name and says which session it
    serves."""
    served = set()
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] != sessions.policy.namespace or entry["name"] == DIRECTORY_NAME:
            continue
        try:
            handle = ray.get_actor(entry["name"], namespace=entry["namespace"])
            status = await asyncio.wait_for(handle.status.remote(), 5)
        except (ray.exceptions.RayActorError, ValueError, TimeoutError):
            continue  # gone meanwhile
        if (status["name"] or "").startswith(f"{org}/session/"):
            served.add(status["name"])
    return served


def recorded_reprs(namespace: str) -> dict[str, str]:
    """``repr_name`` by actor name and by actor id, for a namespace's actors (dead ones too),
    as the GCS records them: the table the Ray dashboard's Actors tab and ``ray list actors
    --detail`` read through the dashboard's state API (``ray.util.state``), which needs a
    dashboard this test cluster does not start, so the table is read here directly."""
    from ray._private.state import state
    from ray.core.generated.gcs_pb2 import ActorTableData

    found = {}
    for raw in state._global_state_accessor.get_actor_table(None, None):
        actor = ActorTableData.FromString(raw)
        if actor.ray_namespace == namespace:
            found[actor.name] = found[actor.actor_id.hex()] = actor.repr_name
    return found


async def equals(value: Any, expected: Any) -> bool:
    """``await value == expected``, for ``eventually``."""
    return bool(await value == expected)


async def is_empty(value: Any) -> bool:
    """``not await value``, for ``eventually``."""
    return not await value


async def warm_actors(directory: Any) -> list[str]:
    """The actor ids of the directory's warm actors."""
    ids: list[str] = await directory.warm_actors.remote()
    return ids


async def eventually(check: Any, within: float = 10.0, every: float = 0.05) -> Any:
    """Poll ``check`` (sync or async) until it is truthy or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(every)


async def directory_sees(sessions: SessionManager, org: str, names: list[str]) -> bool:
    """The directory's live sessions of ``org`` are ``names`` (in any order)."""
    try:
        live = [n for n in await sessions.live_sessions() if n.startswith(f"{org}/")]
        return sorted(live) == sorted(names)
    except ray.exceptions.RayActorError:  # restarting
        return False


async def chat_session(local: Runtime, org: str) -> tuple[Principal, uuid.UUID]:
    agent = await local.create_agent(org, f"chat-{uuid.uuid4().hex[:6]}")
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    session = await local.open_session(org, agent.id, alice)
    return alice, session.id


# without a cluster --------------------------------------------------------------------------


def test_actor_names_round_trip_even_with_slashes_in_the_organisation() -> None:
    run, session = ActorKey.run("acme/emea", uuid.uuid4()), ActorKey.session("o", uuid.uuid4())
    assert run.name.startswith("acme/emea/run/") and session.name.startswith("o/session/")
    assert ActorKey.parse(run.name) == run and ActorKey.parse(session.name) == session
    assert ActorKey.parse(DIRECTORY_NAME) is None
    assert ActorKey.parse("o/session/not-a-uuid") is None


def test_the_manager_needs_the_dsn_of_a_running_database(settings: Settings) -> None:
    with pytest.raises(ConfigurationError, match="database_url"):
        SessionManager(settings.model_copy(update={"database_url": None}))


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(actors).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(actors.__all__) == public
    # isort-style, as ruff keeps it: constants first, then the rest in order.
    assert list(actors.__all__) == sorted(actors.__all__, key=lambda n: (not n.isupper(), n))


# runs --------------------------------------------------------------------------------------


async def test_a_run_driven_by_its_actor_completes_and_the_actor_exits(
    ray_cluster, local, actor_settings, org
) -> None:
    sessions = manager(actor_settings)
    assert isinstance(sessions, Executor)
    agent = await local.create_agent(
        org, "worker", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"]
    )
    run = await local.start_run(org, agent.id, "apply every effect", max_steps=6)
    await sessions.start_run(org, run.id)
    await sessions.start_run(org, run.id)  # idempotent: one actor, one drive
    assert await sessions.wait_run(org, run.id) is RunStatus.COMPLETED

    done = await local.store.get_run(org, run.id)
    assert [s.step_index for s in done.steps] == [0, 1, 2, 3]
    assert done.result == "all applied"
    # A run actor exits when its run is terminal.
    assert await eventually(lambda: not live_actors(sessions, org, "run"))
    # Ray's dashboard names the agent it served (issue 16).
    assert recorded_reprs(sessions.policy.namespace)[ActorKey.run(org, run.id).name] == (
        f"AgentSession(org={org} agent=worker run={run.id})"
    )


async def unopenable(settings: Settings) -> Runtime:
    """A runtime factory that always fails (a model backend that is down, say)."""
    raise RuntimeError("the model backend is down")


async def test_a_run_no_actor_can_drive_ends_failed_with_the_reason(
    ray_cluster, local, actor_settings, org
) -> None:
    sessions = SessionManager(
        actor_settings,
        factory=unopenable,
        policy=SessionPolicy(namespace=f"test-down-{uuid.uuid4().hex[:8]}", run_retry_limit=1),
    )
    agent = await local.create_agent(org, "doomed", mode=AgentMode.AUTONOMOUS)
    run = await local.start_run(org, agent.id, "never driven", max_steps=3)
    await sessions.start_run(org, run.id)
    assert await asyncio.wait_for(sessions.wait_run(org, run.id), 60) is RunStatus.FAILED
    failed = await local.store.get_run(org, run.id)
    assert failed.reason is not None and failed.reason.startswith("gave up after 2 failed")
    assert "the model backend is down" in failed.reason
    assert failed.steps == ()


async def test_runs_survive_their_actor_being_killed_at_random_steps(
    ray_cluster, local, actor_settings, org, db
) -> None:
    """The issue's chaos test: 22 runs (at least 20 hit), each one's actor killed at a
    random point (every fifth run twice): ray.kill, ray.kill with restart, or SIGKILL of its
    process, inside a side effect or between steps. Every run completes, its steps are
    contiguous, and no effect happens twice."""
    seed = int(os.environ.get("CHAOS_SEED", "20261129"))
    rng = random.Random(seed)
    sessions = manager(actor_settings)
    namespace = sessions.policy.namespace
    agent = await local.create_agent(
        org, "payer", mode=AgentMode.AUTONOMOUS, tools=["apply_effect"]
    )
    kinds = ["ray.kill", "ray.kill(no_restart=False)", "SIGKILL"]
    runs = [
        (await local.start_run(org, agent.id, f"apply every effect #{i}", max_steps=6)).id
        for i in range(22)
    ]
    plans: dict[uuid.UUID, list[tuple[str, str, int]]] = {}
    for i, run_id in enumerate(runs):
        # (how, where, s): inside the side effect of step s, or once more than s steps are
        # recorded (between steps, or in the model and memory part of the next one).
        where = rng.choice(["effect", "steps"])
        first = (kinds[i % 3], where, rng.randrange(0, EFFECTS if where == "effect" else 2))
        plan = [first]
        if i % 5 == 0 and first[2] < EFFECTS - 1:
            plan.append((kinds[(i + 1) % 3], "effect", rng.randrange(first[2] + 1, EFFECTS)))
        plans[run_id] = plan

    kills: Counter[str] = Counter()
    killed: Counter[uuid.UUID] = Counter()

    async def kill(run_id: uuid.UUID, how: str) -> bool:
        try:
            handle = ray.get_actor(ActorKey.run(org, run_id).name, namespace=namespace)
            if how == "SIGKILL":
                os.kill(await asyncio.wait_for(handle.pid.remote(), 2), signal.SIGKILL)
            else:
                ray.kill(handle, no_restart=how == "ray.kill")
        except (ValueError, TimeoutError, ray.exceptions.RayActorError):
            return False  # between actors at that moment: try again at the next poll
        kills[how] += 1
        killed[run_id] += 1
        return True

    attempts: dict[uuid.UUID, asyncio.Task[None]] = {}

    async def attempt(run_id: uuid.UUID, how: str, plan: list[tuple[str, str, int]]) -> None:
        try:
            if await kill(run_id, how) and plan:
                plan.pop(0)
        finally:
            attempts.pop(run_id, None)

    async def chaos() -> None:
        """One poller for every run (cheap on 2 cores): fire each kill when its point comes."""
        deadline = time.monotonic() + 90
        while any(plans.values()) and time.monotonic() < deadline:
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT idem_key FROM actor_test_invocations WHERE run_id = ANY(%s)", (runs,)
                )
                invoked = {row["idem_key"] for row in await cur.fetchall()}
                cur = await conn.execute(
                    "SELECT run_id, count(*) AS n FROM run_steps WHERE org_id = %s "
                    "AND run_id = ANY(%s) GROUP BY run_id",
                    (org, runs),
                )
                recorded = {row["run_id"]: row["n"] for row in await cur.fetchall()}
            for run_id, plan in plans.items():
                if not plan:
                    continue
                how, where, step = plan[0]
                hit_effect = where == "effect" and f"{run_id}:{step}" in invoked
                if recorded.get(run_id, 0) > EFFECTS:  # finished first: nothing left to hit
                    plan.clear()
                elif run_id not in attempts and (
                    hit_effect or (where == "steps" and recorded.get(run_id, 0) > step)
                ):
                    # Fired without waiting: a kill that waits on a restarting actor must
                    # not keep the poller from the other runs' windows.
                    attempts[run_id] = asyncio.create_task(attempt(run_id, how, plan))
            await asyncio.sleep(0.02)
        await asyncio.gather(*attempts.values())

    started = time.monotonic()
    # The poller starts first: starting 22 actors takes a while on 2 cores, and the early
    # runs must not finish before anyone is watching them.
    poller = asyncio.create_task(chaos())
    for run_id in runs:
        await sessions.start_run(org, run_id)
    await poller
    statuses = await asyncio.wait_for(
        asyncio.gather(*(sessions.wait_run(org, r) for r in runs)), timeout=120
    )
    elapsed = time.monotonic() - started

    assert statuses == [RunStatus.COMPLETED] * len(runs)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT run_id, effect, idem_key FROM actor_test_effects WHERE run_id = ANY(%s)",
            (runs,),
        )
        effects = await cur.fetchall()
        cur = await conn.execute(
            "SELECT idem_key, count(*) AS n FROM actor_test_invocations "
            "WHERE run_id = ANY(%s) GROUP BY idem_key HAVING count(*) > 1",
            (runs,),
        )
        retried = await cur.fetchall()
    interrupted = 0
    for run_id in runs:
        run = await local.store.get_run(org, run_id)
        assert [s.step_index for s in run.steps] == list(range(EFFECTS + 1)), run_id
        applied = sorted(e["effect"] for e in effects if e["run_id"] == run_id)
        assert applied == [f"e{i}" for i in range(EFFECTS)], (run_id, applied)  # once each
        keys = {e["idem_key"] for e in effects if e["run_id"] == run_id}
        assert keys == {f"{run_id}:{i}" for i in range(EFFECTS)}
        audit = await local.store.audit_rows(org, run_id=run_id)
        # Each step's action completed exactly once; a step cut short by a kill was seen by
        # the resumed run (INTERRUPTED) and decided again under the same key.
        # (Rows without a step index are the use case's own, e.g. starting the task.)
        done = Counter(
            a["step_index"] for a in audit if a["status"] == "OK" and a["step_index"] is not None
        )
        assert done == Counter(range(EFFECTS)), (run_id, done)
        cut = [a for a in audit if a["status"] == "INTERRUPTED"]
        assert all(a["idempotency_key"] == f"{run_id}:{a['step_index']}" for a in cut)
        interrupted += len(cut)
    assert interrupted, "no kill landed inside a side effect"
    # At least 20 runs lost their actor mid-run (22 are started so that one finishing before
    # its kill point cannot make the test flaky).
    assert len(killed) >= 20, dict(killed)
    assert await eventually(lambda: not live_actors(sessions, org, "run"))
    print(
        f"\nchaos: {len(runs)} runs, kills {dict(kills)}, {interrupted} interrupted steps "
        f"decided again, {len(retried)} keys invoked twice and applied once, "
        f"{elapsed:.1f} s (seed {seed})"
    )


# sessions ----------------------------------------------------------------------------------


async def test_turns_queue_one_at_a_time_and_end_session_retires_the_actor(
    ray_cluster, local, actor_settings, org
) -> None:
    # No warm pool: the session's actor is named after its key (the cold path).
    sessions = manager(actor_settings, f"test-cold-{uuid.uuid4().hex[:8]}", warm_actors=0)
    alice, session_id = await chat_session(local, org)
    replies = await asyncio.gather(
        *(sessions.turn(org, session_id, alice, f"message {i}") for i in range(3))
    )
    said = sorted(r.reply.split(" (")[0] for r in replies)
    assert said == [f"echo: message {i}" for i in range(3)]
    turns = await local.store.conversation(org, session_id)
    # Serialised: each user message is directly followed by its own reply.
    for user, assistant in zip(turns[::2], turns[1::2], strict=True):
        assert user.role == "user" and assistant.content.startswith(f"echo: {user.content} (")
    name = ActorKey.session(org, session_id).name
    assert await sessions.live_sessions() == [name]
    assert live_actors(sessions, org, "session") == {name}
    agent = await local.store.get_agent(
        org, (await local.store.get_session(org, session_id)).agent_id
    )
    assert recorded_reprs(sessions.policy.namespace)[name] == (
        f"AgentSession(org={org} agent={agent.name} session={session_id})"
    )

    facts = await sessions.end_session(org, session_id)
    assert [f.content for f in facts] == ["it ended"]
    assert (await local.store.get_session(org, session_id)).status is SessionStatus.ENDED
    assert await eventually(lambda: not live_actors(sessions, org, "session"))
    assert await eventually(lambda: directory_sees(sessions, org, []))


async def test_a_turn_streams_its_events_from_the_actor_as_they_happen(
    ray_cluster, local, actor_settings, org
) -> None:
    sessions = manager(actor_settings, slow_s=1.0)
    alice, session_id = await chat_session(local, org)
    heard: list[tuple[TurnEvent, int]] = []

    async def on_event(event: TurnEvent) -> None:
        # A turn writes its messages when it ends: none yet means the turn is still running.
        heard.append((event, len(await local.store.conversation(org, session_id))))

    result = await sessions.turn(
        org, session_id, alice, "slow: what time is it?", on_event=on_event
    )
    kinds = [event.kind for event, _ in heard]
    assert kinds == [TurnEventKind.TOOL_CALL, TurnEventKind.OBSERVATION, TurnEventKind.REPLY]
    call, observation, reply = (event for event, _ in heard)
    assert call.tool == "current_time" and call.args == {} and call.round == 0
    assert observation.observation is not None and observation.observation.status.value == "OK"
    assert reply.text == result.reply and (result.reply or "").startswith("echo: Progress so far")
    # The tool call and its observation arrived while the (slow) reply was being decided.
    assert [stored for _, stored in heard[:2]] == [0, 0]
    assert len(await local.store.conversation(org, session_id)) == 3  # user, tool, assistant

    # A listener that fails loses its events, never the turn.
    def broken(event: TurnEvent) -> None:
        raise RuntimeError("the listener went away")

    again = await sessions.turn(org, session_id, alice, "hello", on_event=broken)
    assert again.reply == "echo: hello (replies seen: 1)"


async def test_a_turn_beyond_the_queue_bound_is_refused_busy(
    ray_cluster, local, actor_settings, org
) -> None:
    sessions = manager(actor_settings, max_pending_turns=1)
    alice, session_id = await chat_session(local, org)
    await sessions.turn(org, session_id, alice, "hello")  # the actor is up
    slow = asyncio.create_task(sessions.turn(org, session_id, alice, "slow question"))
    assert await eventually(lambda: busy(sessions, org, session_id))
    with pytest.raises(SessionBusyError, match="limit 1"):
        await sessions.turn(org, session_id, alice, "are you there?")
    assert (await slow).reply.startswith("echo: slow question")
    assert (await sessions.turn(org, session_id, alice, "now?")).reply.startswith("echo: now?")


async def test_an_idle_session_passivates_and_comes_back_with_its_history(
    ray_cluster, local, actor_settings, org
) -> None:
    namespace = f"test-idle-{uuid.uuid4().hex[:8]}"
    sessions = manager(actor_settings, namespace, idle_timeout_s=1.0, warm_actors=1)
    directory = sessions.directory()
    alice, session_id = await chat_session(local, org)
    first = await sessions.turn(org, session_id, alice, "remember me")
    assert first.reply == "echo: remember me (replies seen: 0)"
    assert await live_sessions(sessions, org) == {ActorKey.session(org, session_id).name}
    first_actor = await sessions.session_actor(org, session_id)
    assert first_actor is not None
    first_id = (await first_actor.status.remote())["actor_id"]

    assert await eventually(lambda: is_empty(live_sessions(sessions, org)), 10)
    assert await eventually(lambda: directory_sees(sessions, org, []))

    # The next message is served by a warm actor that adopts the session: started before
    # the message came (so its start is not in the turn), not the passivated one.
    warm = await eventually(lambda: warm_actors(directory), 60, 0.2)
    assert warm, "the directory keeps a warm actor"
    again = await sessions.turn(org, session_id, alice, "still there?")
    assert again.reply == "echo: still there? (replies seen: 1)"  # history from PostgreSQL
    assert len(await local.store.conversation(org, session_id)) == 4
    adopted = await sessions.session_actor(org, session_id)
    assert adopted is not None
    status = await adopted.status.remote()
    assert status["actor_id"] in warm and status["actor_id"] != first_id
    assert status["name"] == ActorKey.session(org, session_id).name
    # Ray recorded the warm actor's repr when it started, before it had a session, and
    # never records it again: the dashboard says "warm"; its status names the agent.
    assert recorded_reprs(namespace)[status["actor_id"]] == "AgentSession(warm)"
    agent = await local.store.get_agent(
        org, (await local.store.get_session(org, session_id)).agent_id
    )

    async def agent_known() -> bool:
        return bool((await adopted.status.remote())["agent"] == agent.name)

    assert await eventually(agent_known)

    # A message racing a passivation is refused unrun by the leaving actor and served by
    # its successor.
    assert await sessions.passivate(org, session_id)
    raced = await sessions.turn(org, session_id, alice, "and now?")
    assert raced.reply == "echo: and now? (replies seen: 2)"


async def test_the_live_cap_evicts_the_least_recently_used_idle_session(
    ray_cluster, local, actor_settings, org
) -> None:
    # a's slow turn (3 s) outlasts c's actor start, so a is still busy when c arrives.
    cap = f"test-cap-{uuid.uuid4().hex[:8]}"
    sessions = manager(actor_settings, cap, slow_s=3.0, max_live_sessions=2)
    alice, a = await chat_session(local, org)
    _, b = await chat_session(local, org)
    _, c = await chat_session(local, org)
    name = {s: ActorKey.session(org, s).name for s in (a, b, c)}

    await sessions.turn(org, a, alice, "a1")
    await sessions.turn(org, b, alice, "b1")
    assert await eventually(lambda: directory_sees(sessions, org, [name[a], name[b]]))

    # a is the least recently used but busy: the cap skips it and evicts b.
    slow = asyncio.create_task(sessions.turn(org, a, alice, "slow a2"))
    assert await eventually(lambda: busy(sessions, org, a))
    await sessions.turn(org, c, alice, "c1")
    assert await eventually(lambda: equals(live_sessions(sessions, org), {name[a], name[c]}))
    await slow
    await sessions.turn(org, a, alice, "a3")  # c is now the least recently used

    # b comes back on its next message, with its history; c is evicted.
    reply = await sessions.turn(org, b, alice, "b2")
    assert reply.reply == "echo: b2 (replies seen: 1)"
    assert await eventually(lambda: equals(live_sessions(sessions, org), {name[a], name[b]}))
    assert await eventually(lambda: directory_sees(sessions, org, [name[a], name[b]]))

    # The directory keeps only goal state: killed (Ray restarts it), it rebuilds its view
    # of the live sessions by asking the cluster.
    ray.kill(sessions.directory(), no_restart=False)
    assert await eventually(lambda: directory_sees(sessions, org, [name[a], name[b]]), 20, 0.2)
