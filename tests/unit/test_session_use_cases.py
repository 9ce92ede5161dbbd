"""The session use cases on the fakes (open, read, admit a turn, admit an end), decided and
audited by the real gate; no turn is driven here (that is the executor's)."""

from __future__ import annotations

import pytest
from fakes import FakeStore, FakeTransaction

from cortex_ray import Settings
from cortex_ray._exceptions import AccessDeniedError, ConflictError, InvalidRequestError
from cortex_ray._types import Agent, AgentMode, Principal, Session, SessionStatus
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._sessions import SessionUseCases
from cortex_ray.runtime._traces import Traces
from cortex_ray.storage import SessionMessage, TurnStatus

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
CAROL = Principal(id="carol", org_id="acme")
DAVE = Principal(id="dave", org_id="acme")


@pytest.fixture
def sessions(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> SessionUseCases:
    return SessionUseCases(gate, fake_store, fake_store, settings, Traces(None))


@pytest.fixture
async def helper(fake_store: FakeStore) -> Agent:
    return await fake_store.create_agent(Agent(org_id="acme", name="helper"))


@pytest.fixture
async def session(sessions: SessionUseCases, helper: Agent) -> Session:
    return await sessions.open_session("acme", "helper", CAROL)


def _rows(store: FakeStore) -> list[tuple[object, ...]]:
    return [
        (r["tool"], r["status"], r["action_type"], r["principal_id"], r["session_id"])
        for r in store.audit
    ]


async def test_a_session_is_opened_for_its_caller_with_its_row(
    sessions: SessionUseCases, fake_store: FakeStore, helper: Agent
) -> None:
    session = await sessions.open_session("acme", "helper", CAROL)
    assert await fake_store.get_session("acme", session.id) == session
    assert (session.caller_id, session.agent_id, session.status) == (
        "carol", helper.id, SessionStatus.OPEN
    )  # fmt: skip
    assert await fake_store.get_principal("acme", "carol") == CAROL
    assert _rows(fake_store) == [("sessions.open", "OK", "GROUNDING", "carol", session.id)]
    assert (fake_store.audit[0]["agent_id"], fake_store.audit[0]["tier"]) == (helper.id, "write")


async def test_an_autonomous_agent_takes_no_session(
    sessions: SessionUseCases, fake_store: FakeStore
) -> None:
    await fake_store.create_agent(Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS))
    with pytest.raises(InvalidRequestError, match="set its mode to INTERACTIVE"):
        await sessions.open_session("acme", "worker", CAROL)
    assert fake_store.sessions == {} and fake_store.audit == []


async def test_the_caller_talks_and_reads_the_conversation(
    sessions: SessionUseCases, fake_store: FakeStore, session: Session
) -> None:
    turn = await sessions.accept_turn("acme", session.id, "what time is it?", principal=CAROL)
    assert (turn.status, turn.caller_id, turn.ordinal) == (TurnStatus.ACCEPTED, "carol", 0)
    assert await sessions.get_turn("acme", session.id, turn.id, principal=ADMIN) == turn
    said = SessionMessage(
        role="user", content="what time is it?", turn_id=turn.id, turn_status=TurnStatus.ACCEPTED
    )
    assert await sessions.conversation("acme", session.id, principal=CAROL) == [said]
    assert await sessions.conversation("acme", session.id, principal=ADMIN) == [said]
    # Admitting a message and reading are not audited when allowed.
    assert [r[0] for r in _rows(fake_store)] == ["sessions.open"]


async def test_someone_else_may_neither_read_nor_talk(
    sessions: SessionUseCases, fake_store: FakeStore, session: Session
) -> None:
    with pytest.raises(AccessDeniedError, match="another caller"):
        await sessions.conversation("acme", session.id, principal=DAVE)
    with pytest.raises(AccessDeniedError, match="own caller"):
        await sessions.accept_turn("acme", session.id, "hi", principal=ADMIN)
    outsider = Principal(id="eve", org_id="umbrella", is_admin=True)
    with pytest.raises(AccessDeniedError, match="another organisation"):
        await sessions.get_session("acme", session.id, principal=outsider)
    assert fake_store.turns == {}
    assert _rows(fake_store)[1:] == [
        ("sessions.read", "REFUSED", "RETRIEVAL", "dave", session.id),
        ("sessions.message", "REFUSED", "GROUNDING", "root", session.id),
        ("sessions.read", "REFUSED", "RETRIEVAL", "eve", session.id),
    ]


async def test_a_busy_or_ended_session_admits_no_turn(
    sessions: SessionUseCases, fake_store: FakeStore, session: Session, settings: Settings
) -> None:
    for i in range(settings.sessions.max_pending_turns):
        await sessions.accept_turn("acme", session.id, f"message {i}", principal=CAROL)
    with pytest.raises(ConflictError, match="try again"):
        await sessions.accept_turn("acme", session.id, "one more", principal=CAROL)
    # What the executor's end of the session leaves (``Store.end_session``).
    fake_store.sessions["acme", session.id] = session.model_copy(
        update={"status": SessionStatus.ENDED}
    )
    with pytest.raises(ConflictError, match="has ended"):
        await sessions.accept_turn("acme", session.id, "hello?", principal=CAROL)
    assert len(fake_store.turns["acme", session.id]) == settings.sessions.max_pending_turns


async def test_ending_is_admitted_once_and_audited(
    sessions: SessionUseCases, fake_store: FakeStore, session: Session
) -> None:
    with pytest.raises(AccessDeniedError):
        await sessions.authorize_end_session("acme", session.id, principal=DAVE)
    admitted = await sessions.authorize_end_session("acme", session.id, principal=CAROL)
    assert admitted == session
    assert _rows(fake_store)[1:] == [
        ("sessions.end", "REFUSED", "LEARNING", "dave", session.id),
        ("sessions.end", "OK", "LEARNING", "carol", session.id),
    ]
    ended = session.model_copy(update={"status": SessionStatus.ENDED})
    fake_store.sessions["acme", session.id] = ended
    assert await sessions.authorize_end_session("acme", session.id, principal=CAROL) == ended
    assert len(fake_store.audit) == 3
