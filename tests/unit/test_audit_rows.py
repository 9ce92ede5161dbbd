"""Every allowed audited use case on the fakes writes exactly the row the real door writes
(``tests/test_use_cases.py``, ``test_allowed_writes_are_audited_with_their_category``):
its label, status, category, tier and principal, with the run or session it concerns; an
allowed read writes none."""

from __future__ import annotations

from uuid import UUID

from fakes import FakeStore, FakeTransaction, NoDriver

from cortex_ray import Settings
from cortex_ray._types import AgentChanges, AgentMode, Principal
from cortex_ray.act import ToolRegistry, builtin_tools
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._agents import AgentUseCases
from cortex_ray.runtime._keys import KeyUseCases
from cortex_ray.runtime._runs import RunUseCases
from cortex_ray.runtime._sessions import SessionUseCases
from cortex_ray.runtime._traces import Traces

ROOT = Principal(id="root", org_id="acme", is_admin=True)
CAROL = Principal(id="carol", org_id="acme")


async def test_the_rows_of_allowed_use_cases_are_the_real_doors(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> None:
    agents = AgentUseCases(gate, fake_store, ToolRegistry(builtin_tools()))
    runs = RunUseCases(gate, fake_store, NoDriver(), settings, Traces(None), "test:1")
    sessions = SessionUseCases(gate, fake_store, fake_store, settings, Traces(None))
    keys = KeyUseCases(gate, fake_store)

    helper = await agents.create_agent("acme", "helper", principal=ROOT)
    worker = await agents.create_agent("acme", "worker", mode=AgentMode.AUTONOMOUS)
    await agents.update_agent("acme", "helper", AgentChanges(persona="kind"), principal=ROOT)
    run = await runs.start_run("acme", "worker", "tidy up", caller_id="carol", principal=ROOT)
    session = await sessions.open_session("acme", "helper", CAROL)
    created = await keys.create_api_key("acme", "ci", principal=None)
    await runs.cancel_run("acme", run.id, principal=CAROL)
    await keys.revoke_api_key("acme", created.key_id, principal=ROOT)
    await sessions.authorize_end_session("acme", session.id, principal=CAROL)
    written = len(fake_store.audit)
    # Allowed reads: no row (a long poll would write one a poll).
    await agents.list_agents("acme", principal=CAROL)
    await runs.get_run("acme", run.id, principal=CAROL)
    await runs.list_runs("acme", principal=CAROL)
    await sessions.get_session("acme", session.id, principal=CAROL)
    await sessions.conversation("acme", session.id, principal=CAROL)
    assert len(fake_store.audit) == written

    def concerns(row: dict[str, object]) -> UUID | None:
        value = row["run_id"] or row["session_id"] or row["agent_id"]
        assert value is None or isinstance(value, UUID)
        return value

    assert [
        (r["tool"], r["status"], r["action_type"], r["tier"], r["principal_id"], concerns(r))
        for r in await fake_store.audit_rows("acme")
    ] == [
        ("agents.create", "OK", "LEARNING", "admin", "root", helper.id),
        ("agents.create", "OK", "LEARNING", "admin", "operator", worker.id),
        ("agents.update", "OK", "LEARNING", "admin", "root", helper.id),
        ("tasks.submit", "OK", "GROUNDING", "write", "root", run.id),
        ("sessions.open", "OK", "GROUNDING", "write", "carol", session.id),
        ("api_keys.create", "OK", "GROUNDING", "admin", "operator", None),
        ("tasks.cancel", "OK", "GROUNDING", "write", "carol", run.id),
        ("api_keys.revoke", "OK", "GROUNDING", "admin", "root", None),
        ("sessions.end", "OK", "LEARNING", "write", "carol", session.id),
    ]
    # Rows of use cases are the door's, not the invocation gate's (which has a mode).
    assert await fake_store.audit_rows("acme", gate_only=True) == []
    assert [r["id"] for r in await fake_store.audit_rows("acme", run_id=run.id)] == [
        r["id"] for r in fake_store.audit if r["run_id"] == run.id
    ]
