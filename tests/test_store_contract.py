"""One contract for the store protocols, held by the in-memory fakes and the real store.

Each test runs twice: against ``tests/fakes/`` (marked ``unit``: no PostgreSQL is
started) and against ``Store`` on the embedded PostgreSQL (the ``db`` fixture is asked
for only by that variant). A fake that drifts from the real store fails here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fakes import AUDIT_COLUMNS, FakeDatabase, FakeStore

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from cortex_ray._types import (
    ActionType,
    Agent,
    AgentMode,
    Grant,
    Principal,
    PrincipalKind,
    RunStatus,
    Session,
    TaskRun,
    Turn,
    utcnow,
)
from cortex_ray.observability import REDACTED, scrub_text
from cortex_ray.storage import AuditEntry, SessionMessage, TurnStatus, TurnStore


@dataclass
class Backend:
    """The unit of work and the store of one variant."""

    db: Any
    store: Any
    turns: Any


@pytest.fixture(params=[pytest.param("fake", marks=pytest.mark.unit), "postgres"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "fake":
        db = FakeDatabase()
        store = FakeStore(db)
        return Backend(db, store, store)
    db = request.getfixturevalue("db")
    return Backend(db, request.getfixturevalue("store"), TurnStore(db))


@pytest.fixture
def other_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def _agent(org: str, name: str = "helper", **fields: Any) -> Agent:
    return Agent(org_id=org, name=name, **fields)


def _run(org: str, agent: Agent, goal: str = "do it", **fields: Any) -> TaskRun:
    return TaskRun(org_id=org, agent_id=agent.id, goal=goal, max_steps=4, **fields)


def _entry(org: str, tool: str = "agents.create", **fields: Any) -> AuditEntry:
    values: dict[str, Any] = {
        "org_id": org,
        "principal_id": "alice",
        "tool": tool,
        "action_type": ActionType.LEARNING,
        "status": "OK",
        "reason": None,
        "args": {"name": "x"},
        "duration_ms": 0.0,
    }
    return AuditEntry(**{**values, **fields})


# organisations and principals -----------------------------------------------------------


async def test_an_invalid_organisation_id_is_refused(backend: Backend, org: str) -> None:
    await backend.store.ensure_org(org)
    await backend.store.ensure_org(org)  # twice: nothing changes
    with pytest.raises(InvalidRequestError, match="invalid organisation id"):
        await backend.store.ensure_org("no spaces here")
    with pytest.raises(InvalidRequestError):
        await backend.store.put_principal(Principal(id="p", org_id="-leading-dash"))


async def test_principals_are_upserted_and_scoped(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    alice = Principal(id="alice", org_id=org, kind=PrincipalKind.USER, name="Alice")
    assert await store.put_principal(alice) == alice
    assert await store.get_principal(org, "alice") == alice
    admin = alice.model_copy(update={"is_admin": True, "grant": Grant(tools={"current_time"})})
    await store.put_principal(admin)
    assert await store.get_principal(org, "alice") == admin
    with pytest.raises(NotFoundError, match="principal 'alice' not found"):
        await store.get_principal(other_org, "alice")
    with pytest.raises(NotFoundError):
        await store.get_principal(org, "bob")


# agents ---------------------------------------------------------------------------------


async def test_agents_are_found_by_id_or_name_in_their_organisation(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org, tools=("current_time",), critic=True))
    assert agent.name == "helper" and agent.tools == ("current_time",) and agent.critic
    assert await store.get_agent(org, agent.id) == agent
    assert await store.get_agent(org, str(agent.id)) == agent
    assert await store.get_agent(org, "helper") == agent
    for ref in (agent.id, "helper"):
        with pytest.raises(NotFoundError, match="not found in organisation"):
            await store.get_agent(other_org, ref)
    with pytest.raises(NotFoundError):
        await store.get_agent(org, uuid.uuid4())
    with pytest.raises(NotFoundError):
        await store.get_agent(org, "nobody")


async def test_an_agent_name_is_unique_in_its_organisation_only(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    await store.create_agent(_agent(org))
    with pytest.raises(InvalidRequestError, match="already exists"):
        await store.create_agent(_agent(org))
    await store.create_agent(_agent(other_org))  # another organisation: fine
    assert [a.name for a in await store.list_agents(org)] == ["helper"]


async def test_agents_are_listed_oldest_first_per_organisation(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    now = utcnow()
    await store.create_agent(_agent(org, "b", created_at=now))
    await store.create_agent(_agent(org, "a", created_at=now))
    await store.create_agent(_agent(org, "c", created_at=now - timedelta(minutes=1)))
    await store.create_agent(_agent(other_org, "z"))
    assert [a.name for a in await store.list_agents(org)] == ["c", "a", "b"]
    assert await store.list_agents(f"{org}-none") == []


async def test_an_update_replaces_the_definition_but_never_the_name(
    backend: Backend, org: str
) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org, created_at=utcnow() - timedelta(hours=1)))
    wanted = agent.model_copy(
        update={
            "name": "renamed",
            "persona": "terse",
            "mode": AgentMode.AUTONOMOUS,
            "tools": ("current_time",),
            "skills": ("be brief",),
            "grant": None,
            "critic": True,
        }
    )
    changed = await store.update_agent(wanted)
    assert changed.name == "helper"
    assert (changed.persona, changed.mode, changed.tools, changed.skills) == (
        "terse",
        AgentMode.AUTONOMOUS,
        ("current_time",),
        ("be brief",),
    )
    assert changed.grant is None and changed.critic
    assert changed.updated_at > agent.updated_at and changed.created_at == agent.created_at
    assert await store.get_agent(org, agent.id) == changed
    with pytest.raises(NotFoundError):
        await store.update_agent(_agent(org, "ghost"))


# runs -----------------------------------------------------------------------------------


async def test_a_run_reads_back_as_it_was_recorded(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    run = _run(org, agent, name="n", caller_id="alice", contact_context={"k": [1, "2"]})
    assert await store.create_run(run) == run
    assert await store.get_run(org, run.id) == run
    assert await store.get_run(org, run.id, recordings=True) == run
    assert await store.run_status(org, run.id) is RunStatus.RUNNING
    for read in (store.get_run, store.run_status):
        with pytest.raises(NotFoundError, match="not found in organisation"):
            await read(other_org, run.id)
        with pytest.raises(NotFoundError):
            await read(org, uuid.uuid4())


async def test_a_run_needs_an_agent_of_its_organisation(
    backend: Backend, org: str, other_org: str
) -> None:
    agent = await backend.store.create_agent(_agent(org))
    await backend.store.ensure_org(other_org)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        await backend.store.create_run(_run(other_org, agent))


async def test_runs_are_listed_newest_first_per_agent_and_organisation(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    one = await store.create_agent(_agent(org, "one"))
    two = await store.create_agent(_agent(org, "two"))
    elsewhere = await store.create_agent(_agent(other_org, "one"))
    start = utcnow()
    runs = [
        await store.create_run(_run(org, agent, created_at=start + timedelta(seconds=i)))
        for i, agent in enumerate((one, two, one))
    ]
    await store.create_run(_run(other_org, elsewhere))
    assert [r.id for r in await store.list_runs(org)] == [r.id for r in reversed(runs)]
    assert [r.id for r in await store.list_runs(org, one.id)] == [runs[2].id, runs[0].id]
    assert [r.id for r in await store.list_runs(org, limit=1)] == [runs[2].id]
    assert await store.list_runs(org, elsewhere.id) == []


async def test_a_run_is_cancelled_once_and_audited_with_it(backend: Backend, org: str) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    run = await store.create_run(_run(org, agent))
    audit = _entry(org, "tasks.cancel", run_id=run.id)
    assert await store.cancel_run(org, run.id, "cancelled by alice", audit=audit)
    cancelled = await store.get_run(org, run.id)
    assert cancelled.status is RunStatus.CANCELLED and cancelled.reason == "cancelled by alice"
    assert cancelled.finished_at is not None
    assert not await store.cancel_run(org, run.id, "again", audit=_entry(org, "tasks.cancel"))
    assert (await store.get_run(org, run.id)).reason == "cancelled by alice"
    rows = await store.audit_rows(org)
    assert [(r["tool"], r["run_id"]) for r in rows] == [("tasks.cancel", run.id)]
    with pytest.raises(NotFoundError):
        await store.cancel_run(org, uuid.uuid4(), "nothing")


async def test_a_run_fails_only_while_running(backend: Backend, org: str) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    running = await store.create_run(_run(org, agent))
    await store.fail_run(org, running.id, "the model is down")
    failed = await store.get_run(org, running.id)
    assert (failed.status, failed.reason) == (RunStatus.FAILED, "the model is down")
    await store.fail_run(org, running.id, "twice")
    assert (await store.get_run(org, running.id)).reason == "the model is down"
    await store.fail_run(org, uuid.uuid4(), "no such run")  # nothing to do, no error


async def test_a_submission_is_audited_with_its_run(backend: Backend, org: str) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    run = _run(org, agent)
    await store.create_run(run, audit=_entry(org, "tasks.submit", run_id=run.id))
    rows = await store.audit_rows(org, run_id=run.id)
    assert [(r["tool"], r["status"], r["run_id"]) for r in rows] == [("tasks.submit", "OK", run.id)]


async def test_a_run_with_no_spans_or_events_reads_back_none(backend: Backend, org: str) -> None:
    # Spans and diagnostic events are the tracing exporter's and the cycle's writes, never
    # a use case's: a recorded run has none until it is driven.
    store = backend.store
    agent = await store.create_agent(_agent(org))
    run = await store.create_run(_run(org, agent))
    assert await store.trace_spans(org, run.id) == []
    assert await store.spans_of_trace(org, "0" * 32) == []
    assert await store.diagnostics(org, run_id=run.id) == []
    assert await store.diagnostics(org, session_id=uuid.uuid4()) == []
    assert await store.diagnostics(org, session_id=uuid.uuid4(), turn_id=uuid.uuid4()) == []


# sessions -------------------------------------------------------------------------------


async def test_sessions_are_scoped_and_need_an_agent(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    session = Session(org_id=org, agent_id=agent.id, caller_id="alice")
    assert await store.create_session(session) == session
    assert await store.get_session(org, session.id) == session
    with pytest.raises(NotFoundError, match="not found in organisation"):
        await store.get_session(other_org, session.id)
    await store.ensure_org(other_org)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        await store.create_session(Session(org_id=other_org, agent_id=agent.id, caller_id="a"))


async def test_a_second_end_of_a_session_keeps_the_first_ones_time(
    db: Any, store: Any, org: str
) -> None:
    """Two ends of one session racing (a client's and the directory's): the session ended
    when it first ended."""
    from cortex_ray._types import SessionStatus, utcnow

    agent = await store.create_agent(_agent(org))
    session = await store.create_session(Session(org_id=org, agent_id=agent.id, caller_id="a"))
    first = utcnow()
    async with db.transaction() as conn:
        await store.end_session(conn, org, session.id, first)
    async with db.transaction() as conn:
        await store.end_session(conn, org, session.id, first + timedelta(minutes=5))
    ended = await store.get_session(org, session.id)
    assert ended.status is SessionStatus.ENDED and ended.ended_at == first


async def test_a_conversation_keeps_committed_messages_in_order(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    agent = await store.create_agent(_agent(org))
    session = await store.create_session(Session(org_id=org, agent_id=agent.id, caller_id="a"))
    said = [Turn(role="user", content="hi"), Turn(role="assistant", content="hello")]
    async with backend.db.transaction() as conn:
        await store.append_messages(conn, org, session.id, said)
    with pytest.raises(RuntimeError, match="boom"):
        async with backend.db.transaction() as conn:
            await store.append_messages(conn, org, session.id, [Turn(role="user", content="x")])
            raise RuntimeError("boom")  # rolled back: the message is not kept
    later = [Turn(role="tool", content="12:00", tool="current_time")]
    async with backend.db.transaction() as conn:
        await store.append_messages(conn, org, session.id, later)
    assert await store.conversation(org, session.id) == [*said, *later]
    assert await store.conversation(org, session.id, limit=2) == [said[1], *later]
    assert await store.conversation(other_org, session.id) == []
    assert await backend.turns.history(org, session.id) == [
        SessionMessage(role=t.role, content=t.content, tool=t.tool) for t in [*said, *later]
    ]
    assert await backend.turns.history(other_org, session.id) == []


async def test_turns_are_accepted_in_order_for_the_sessions_caller_only(
    backend: Backend, org: str, other_org: str
) -> None:
    store, turns = backend.store, backend.turns
    agent = await store.create_agent(_agent(org))
    session = await store.create_session(Session(org_id=org, agent_id=agent.id, caller_id="a"))
    said = [Turn(role="user", content="hi"), Turn(role="assistant", content="hello")]
    async with backend.db.transaction() as conn:
        await store.append_messages(conn, org, session.id, said)
    first = await turns.accept(org, session.id, "a", "what time is it?")
    second = await turns.accept(org, session.id, "a", "and the date?", max_pending=2)
    assert (first.ordinal, second.ordinal) == (0, 1)
    assert (first.status, first.caller_id, first.message) == (
        TurnStatus.ACCEPTED, "a", "what time is it?"
    )  # fmt: skip
    assert (first.reply, first.events, first.attempts, first.finished_at) == (None, (), 0, None)
    assert await turns.get(org, session.id, first.id) == first
    assert await turns.status(org, session.id, second.id) is TurnStatus.ACCEPTED
    assert await turns.history(org, session.id) == [
        *(SessionMessage(role=t.role, content=t.content) for t in said),
        *(
            SessionMessage(role="user", content=t.message, turn_id=t.id,
                           turn_status=TurnStatus.ACCEPTED)
            for t in (first, second)
        ),
    ]  # fmt: skip
    with pytest.raises(ConflictError, match="limit 2"):
        await turns.accept(org, session.id, "a", "and now?", max_pending=2)
    with pytest.raises(InvalidRequestError, match="empty"):
        await turns.accept(org, session.id, "a", "  ")
    with pytest.raises(AccessDeniedError, match="own caller"):
        await turns.accept(org, session.id, "b", "hi")
    with pytest.raises(NotFoundError):
        await turns.accept(other_org, session.id, "a", "hi")
    for read in (turns.get, turns.status):
        with pytest.raises(NotFoundError, match="not found in session"):
            await read(org, session.id, uuid.uuid4())
        with pytest.raises(NotFoundError):
            await read(other_org, session.id, first.id)
    assert len(await turns.history(org, session.id)) == 4


async def test_work_in_progress_counts_running_runs_and_turns_not_ended(
    backend: Backend, org: str
) -> None:
    """Admission's count: RUNNING runs and turns not ended that are recent (or leased), in
    every organisation (the real database is shared by the suite: the test reads changes,
    not totals)."""
    store, turns = backend.store, backend.turns
    before = await store.work_in_progress(60)
    agent = await store.create_agent(_agent(org))
    run = await store.create_run(_run(org, agent))
    session = await store.create_session(Session(org_id=org, agent_id=agent.id, caller_id="a"))
    await turns.accept(org, session.id, "a", "hi")
    assert await store.work_in_progress(60) == before + 2
    await store.fail_run(org, run.id, "done with it")
    assert await store.work_in_progress(60) == before + 1


# API keys -------------------------------------------------------------------------------


async def test_an_api_key_names_its_principal_until_revoked(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    bob = Principal(id="bob", org_id=org, kind=PrincipalKind.SERVICE, name="Bob")
    key, key_id = await store.create_api_key(bob, "ci")
    assert key.startswith("crx_") and len(key.split("_")[1]) == 8
    assert await store.get_principal(org, "bob") == bob  # a new principal is stored
    assert await store.principal_for_api_key(key) == bob
    for wrong in (key + "x", key.removeprefix("crx_"), "crx_" + "a" * 200, ""):
        assert await store.principal_for_api_key(wrong) is None
    with pytest.raises(NotFoundError, match="no API key"):
        await store.revoke_api_key(other_org, key_id)
    with pytest.raises(NotFoundError):
        await store.revoke_api_key(org, uuid.uuid4())
    revoked_at, now = await store.revoke_api_key(org, key_id)
    assert now and await store.principal_for_api_key(key) is None
    assert await store.revoke_api_key(org, key_id) == (revoked_at, False)


async def test_an_api_key_follows_its_principal(backend: Backend, org: str) -> None:
    store = backend.store
    carol = await store.put_principal(Principal(id="carol", org_id=org))
    key, _ = await store.create_api_key(carol)
    another, _ = await store.create_api_key(carol.model_copy(update={"is_admin": True}))
    assert key != another
    # An existing principal is not replaced by create_api_key (put_principal does that).
    assert await store.principal_for_api_key(another) == carol
    promoted = await store.put_principal(carol.model_copy(update={"is_admin": True}))
    assert await store.principal_for_api_key(key) == promoted


# audit ----------------------------------------------------------------------------------


async def test_an_audit_row_commits_with_its_transaction(
    backend: Backend, org: str, other_org: str
) -> None:
    store = backend.store
    await store.ensure_org(org)
    async with backend.db.transaction() as conn:
        await store.insert_audit(conn, _entry(org, "agents.create"))
    with pytest.raises(RuntimeError):
        async with backend.db.transaction() as conn:
            await store.insert_audit(conn, _entry(org, "agents.update"))
            raise RuntimeError("the write it audits failed")
    rows = await store.audit_rows(org)
    assert [r["tool"] for r in rows] == ["agents.create"]
    assert set(rows[0]) == AUDIT_COLUMNS
    assert await store.audit_rows(other_org) == []


async def test_audit_rows_are_scrubbed_ordered_and_filtered(backend: Backend, org: str) -> None:
    store = backend.store
    run_id = uuid.uuid4()
    entries = [
        _entry(org, "agents.create", args={"password": "hunter2", "name": "x"}),
        _entry(org, "current_time", mode=AgentMode.AUTONOMOUS, run_id=run_id, step_index=0),
        _entry(org, "tasks.submit", run_id=run_id, reason="token sk-abcdefghijklmnop1234"),
    ]
    for entry in entries:
        async with backend.db.transaction() as conn:
            await store.insert_audit(conn, entry)
    rows = await store.audit_rows(org)
    assert [r["tool"] for r in rows] == ["agents.create", "current_time", "tasks.submit"]
    assert rows[0]["args"] == {"password": REDACTED, "name": "x"}
    assert rows[1]["mode"] == AgentMode.AUTONOMOUS.value and rows[1]["step_index"] == 0
    assert rows[0]["action_type"] == ActionType.LEARNING.value
    assert [r["tool"] for r in await store.audit_rows(org, run_id=run_id)] == [
        "current_time",
        "tasks.submit",
    ]
    assert [r["tool"] for r in await store.audit_rows(org, gate_only=True)] == ["current_time"]
    assert rows[0]["id"] < rows[1]["id"] < rows[2]["id"]
    assert rows[2]["reason"] == scrub_text("token sk-abcdefghijklmnop1234")
