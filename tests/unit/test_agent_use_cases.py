"""The agent use cases on the fakes, decided and audited by the real gate: what
``tests/test_use_cases.py`` expects of them on PostgreSQL."""

from __future__ import annotations

import pytest
from fakes import FakeStore, FakeTransaction

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError, NotFoundError
from cortex_ray._types import AgentChanges, AgentMode, Principal
from cortex_ray.act import ToolRegistry, builtin_tools
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._agents import AgentUseCases

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
MEMBER = Principal(id="bob", org_id="acme")


@pytest.fixture
def agents(gate: AccessGate[FakeTransaction], fake_store: FakeStore) -> AgentUseCases:
    return AgentUseCases(gate, fake_store, ToolRegistry(builtin_tools()))


def _rows(store: FakeStore, org: str = "acme") -> list[tuple[object, ...]]:
    return [
        (r["tool"], r["status"], r["action_type"], r["principal_id"], r["agent_id"])
        for r in store.audit
        if r["org_id"] == org
    ]


async def test_an_admin_creates_an_agent_and_one_ok_row_is_written(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    created = await agents.create_agent("acme", "helper", persona="kind", principal=ADMIN)
    assert await fake_store.get_agent("acme", "helper") == created
    assert created.persona == "kind" and created.mode is AgentMode.INTERACTIVE
    assert _rows(fake_store) == [("agents.create", "OK", "LEARNING", "root", created.id)]
    row = fake_store.audit[0]
    assert (row["args"], row["tier"], row["mode"]) == (
        {"name": "helper", "mode": "INTERACTIVE"},
        "admin",
        None,
    )


async def test_no_principal_acts_as_the_operator(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    created = await agents.create_agent("acme", "helper")
    assert _rows(fake_store) == [("agents.create", "OK", "LEARNING", "operator", created.id)]


async def test_a_member_may_not_create_an_agent_and_the_refusal_is_audited(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    with pytest.raises(AccessDeniedError, match="only an admin"):
        await agents.create_agent("acme", "helper", principal=MEMBER)
    assert await fake_store.list_agents("acme") == []
    assert _rows(fake_store) == [("agents.create", "REFUSED", "LEARNING", "bob", None)]
    assert "admin" in fake_store.audit[0]["reason"]


async def test_a_duplicate_name_is_the_stores_error_and_writes_no_row(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    first = await agents.create_agent("acme", "helper", principal=ADMIN)
    with pytest.raises(InvalidRequestError, match="already exists"):
        await agents.create_agent("acme", " helper ", principal=ADMIN)
    assert await fake_store.list_agents("acme") == [first]
    assert [r[1] for r in _rows(fake_store)] == ["OK"]


async def test_unknown_tools_are_refused_before_anything_is_written(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    with pytest.raises(InvalidRequestError, match="unknown tools: teleport"):
        await agents.create_agent("acme", "helper", tools=["teleport"], principal=ADMIN)
    assert await fake_store.list_agents("acme") == []
    assert fake_store.audit == []


async def test_an_update_changes_the_given_fields_and_is_audited(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    created = await agents.create_agent("acme", "helper", principal=ADMIN)
    changes = AgentChanges(mode=AgentMode.AUTONOMOUS, persona="terse")
    changed = await agents.update_agent("acme", "helper", changes, principal=ADMIN)
    stored = await fake_store.get_agent("acme", created.id)
    assert stored == changed
    assert (stored.mode, stored.persona, stored.name) == (AgentMode.AUTONOMOUS, "terse", "helper")
    assert stored.tools == created.tools
    assert _rows(fake_store)[-1] == ("agents.update", "OK", "LEARNING", "root", created.id)
    assert fake_store.audit[-1]["args"] == {"fields": ["mode", "persona"]}


async def test_a_member_may_not_update_an_agent(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    created = await agents.create_agent("acme", "helper", principal=ADMIN)
    changes = AgentChanges(persona="rude")
    with pytest.raises(AccessDeniedError):
        await agents.update_agent("acme", created.id, changes, principal=MEMBER)
    assert (await fake_store.get_agent("acme", created.id)).persona == ""
    assert _rows(fake_store)[-1] == ("agents.update", "REFUSED", "LEARNING", "bob", created.id)


async def test_organisations_see_only_their_own_agents(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    ours = await agents.create_agent("acme", "helper", principal=ADMIN)
    outsider = Principal(id="eve", org_id="umbrella", is_admin=True)
    theirs = await agents.create_agent("umbrella", "helper", principal=outsider)
    assert await agents.list_agents("acme", principal=MEMBER) == [ours]
    assert await agents.list_agents("umbrella", principal=outsider) == [theirs]
    with pytest.raises(NotFoundError):
        await agents.get_agent("umbrella", ours.id, principal=outsider)
    # Another organisation's principal is refused before the agent is looked up.
    with pytest.raises(AccessDeniedError, match="another organisation"):
        await agents.get_agent("acme", ours.id, principal=outsider)
    assert _rows(fake_store) == [
        ("agents.create", "OK", "LEARNING", "root", ours.id),
        ("agents.get", "REFUSED", "RETRIEVAL", "eve", None),
    ]


async def test_reads_are_not_audited_when_allowed(
    agents: AgentUseCases, fake_store: FakeStore
) -> None:
    created = await agents.create_agent("acme", "helper", principal=ADMIN)
    assert await agents.get_agent("acme", "helper", principal=MEMBER) == created
    assert await agents.list_agents("acme", principal=MEMBER) == [created]
    assert len(fake_store.audit) == 1
