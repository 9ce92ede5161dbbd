"""The run use cases on the fakes (start, read, list, cancel), decided and audited by the
real gate; no run is driven here (that is the cycle's, tested on PostgreSQL)."""

from __future__ import annotations

from uuid import uuid4

import pytest
from fakes import FakeStore, FakeTransaction, NoDriver

from cortex_ray import Settings
from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError, NotFoundError
from cortex_ray._types import Agent, AgentMode, Principal, RunStatus
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._runs import RunUseCases
from cortex_ray.runtime._traces import Traces

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
CAROL = Principal(id="carol", org_id="acme")
DAVE = Principal(id="dave", org_id="acme")


@pytest.fixture
def runs(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> RunUseCases:
    return RunUseCases(gate, fake_store, NoDriver(), settings, Traces(None), "test:1")


@pytest.fixture
async def worker(fake_store: FakeStore) -> Agent:
    return await fake_store.create_agent(
        Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS)
    )


def _rows(store: FakeStore) -> list[tuple[object, ...]]:
    return [
        (r["tool"], r["status"], r["action_type"], r["principal_id"], r["run_id"])
        for r in store.audit
    ]


async def test_a_run_is_recorded_running_for_its_principal_with_its_row(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent
) -> None:
    run = await runs.start_run("acme", "worker", " tidy up ", caller_id="carol", principal=DAVE)
    stored = await fake_store.get_run("acme", run.id)
    assert (stored.status, stored.goal) == (RunStatus.RUNNING, "tidy up")
    assert stored.agent_id == worker.id
    assert (stored.requested_by, stored.caller_id) == ("dave", "carol")
    assert _rows(fake_store) == [("tasks.submit", "OK", "GROUNDING", "dave", run.id)]
    assert fake_store.audit[0]["agent_id"] == worker.id
    assert fake_store.audit[0]["args"] == {"agent": "worker", "max_steps": None}


async def test_an_interactive_agent_runs_no_task(runs: RunUseCases, fake_store: FakeStore) -> None:
    await fake_store.create_agent(Agent(org_id="acme", name="chat"))
    with pytest.raises(InvalidRequestError, match="AUTONOMOUS"):
        await runs.start_run("acme", "chat", "tidy up", principal=DAVE)
    assert fake_store.runs == {} and fake_store.audit == []


async def test_a_bad_budget_or_goal_records_nothing(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent, settings: Settings
) -> None:
    with pytest.raises(InvalidRequestError, match="max_steps must be between"):
        await runs.start_run("acme", "worker", "x", max_steps=0, principal=DAVE)
    with pytest.raises(InvalidRequestError, match="goal is empty"):
        await runs.start_run("acme", "worker", "  ", principal=DAVE)
    assert fake_store.runs == {} and fake_store.audit == []


async def test_another_organisations_run_is_not_found(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent
) -> None:
    run = await runs.start_run("acme", "worker", "tidy up", principal=DAVE)
    outsider = Principal(id="eve", org_id="umbrella", is_admin=True)
    with pytest.raises(NotFoundError):
        await runs.get_run("umbrella", run.id, principal=outsider)
    with pytest.raises(AccessDeniedError, match="another organisation"):
        await runs.get_run("acme", run.id, principal=outsider)
    assert await runs.list_runs("umbrella", principal=outsider) == []
    assert [r.id for r in await runs.list_runs("acme", principal=CAROL)] == [run.id]
    assert _rows(fake_store)[-1] == ("tasks.get", "REFUSED", "RETRIEVAL", "eve", None)


async def test_the_runs_caller_cancels_a_live_run_once(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent
) -> None:
    run = await runs.start_run("acme", "worker", "tidy up", caller_id="carol", principal=DAVE)
    cancelled = await runs.cancel_run("acme", run.id, principal=CAROL, reason="not needed")
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.reason == "cancelled by carol: not needed"
    assert await fake_store.run_status("acme", run.id) is RunStatus.CANCELLED
    assert _rows(fake_store)[-1] == ("tasks.cancel", "OK", "GROUNDING", "carol", run.id)
    assert fake_store.audit[-1]["args"] == {
        "run": str(run.id),
        "reason": "cancelled by carol: not needed",
    }
    # An ended run is returned as it is: nothing is written.
    again = await runs.cancel_run("acme", run.id, principal=ADMIN)
    assert (again.status, again.reason) == (RunStatus.CANCELLED, cancelled.reason)
    assert len(fake_store.audit) == 2


async def test_someone_else_may_not_cancel_a_run(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent
) -> None:
    run = await runs.start_run("acme", "worker", "tidy up", caller_id="carol", principal=DAVE)
    with pytest.raises(AccessDeniedError, match="caller or an admin"):
        await runs.cancel_run("acme", run.id, principal=DAVE)
    assert await fake_store.run_status("acme", run.id) is RunStatus.RUNNING
    assert _rows(fake_store)[-1] == ("tasks.cancel", "REFUSED", "GROUNDING", "dave", None)


async def test_a_missing_run_is_not_found_and_reads_write_nothing(
    runs: RunUseCases, fake_store: FakeStore, worker: Agent
) -> None:
    with pytest.raises(NotFoundError):
        await runs.cancel_run("acme", uuid4(), principal=ADMIN)
    run = await runs.start_run("acme", "worker", "tidy up", principal=DAVE)
    assert await runs.run_status("acme", run.id, principal=CAROL) is RunStatus.RUNNING
    assert (await runs.run_trace("acme", run.id, principal=CAROL)).spans == []
    assert (await runs.run_diagnostics("acme", run.id, principal=CAROL)).status == "RUNNING"
    assert len(fake_store.audit) == 1
