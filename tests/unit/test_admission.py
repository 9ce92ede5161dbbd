"""Admission on the fakes: a turn or a run is refused at capacity before anything is
stored (its audit row included), with when to try again; the limit is the setting, or the
capacity the model reports, or none."""

from __future__ import annotations

import pytest
from fakes import FakeStore, FakeTransaction, NoDriver

from cortex_ray import OverloadedError, Settings
from cortex_ray._types import Agent, AgentMode, Principal, TaskRun
from cortex_ray.models import ChatRequest, ChatResponse, ModelCapacity
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._admission import Admission
from cortex_ray.runtime._runs import RunUseCases
from cortex_ray.runtime._sessions import SessionUseCases
from cortex_ray.runtime._traces import Traces

CAROL = Principal(id="carol", org_id="acme")


class _Reporting:
    """A model client that reports a capacity (as the served backend's does)."""

    name = "reporting"
    supports_json_schema = True

    def __init__(self, capacity: ModelCapacity | None) -> None:
        self.report = capacity

    async def chat(self, request: ChatRequest) -> ChatResponse:  # pragma: no cover
        raise AssertionError("admission never calls the model")

    async def capacity(self) -> ModelCapacity | None:
        return self.report

    async def aclose(self) -> None:
        pass


async def _held(store: FakeStore, n: int) -> None:
    """``n`` runs in progress."""
    agent = await store.create_agent(Agent(org_id="busy", name="w", mode=AgentMode.AUTONOMOUS))
    for _ in range(n):
        await store.create_run(TaskRun(org_id="busy", agent_id=agent.id, goal="g", max_steps=1))


def _use_cases(
    gate: AccessGate[FakeTransaction], store: FakeStore, settings: Settings, admission: Admission
) -> tuple[RunUseCases, SessionUseCases]:
    runs = RunUseCases(gate, store, NoDriver(), settings, Traces(None), "t:1", admission)
    sessions = SessionUseCases(gate, store, store, settings, Traces(None), admission)
    return runs, sessions


async def test_at_the_models_capacity_a_turn_and_a_run_are_refused_and_nothing_is_stored(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> None:
    model = _Reporting(ModelCapacity(slots=3, waiting=2, replicas=1, mean_request_s=4.0))
    runs, sessions = _use_cases(gate, fake_store, settings, Admission(fake_store, model, 0, 60))
    await fake_store.create_agent(Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS))
    await fake_store.create_agent(Agent(org_id="acme", name="helper"))
    session = await sessions.open_session("acme", "helper", CAROL)
    await _held(fake_store, 3)
    audit_before, runs_before = len(fake_store.audit), len(fake_store.runs)
    with pytest.raises(OverloadedError, match=r"3 turns and runs are in progress \(limit 3\)") as e:
        await runs.start_run("acme", "worker", "tidy up", principal=CAROL)
    assert e.value.retry_after_s == 12  # 3 calls × 4 s ÷ 1 replica
    with pytest.raises(OverloadedError, match="try again in 12 s"):
        await sessions.accept_turn("acme", session.id, "hello", principal=CAROL)
    assert len(fake_store.runs) == runs_before and len(fake_store.audit) == audit_before
    assert await sessions.conversation("acme", session.id, principal=CAROL) == []
    # One place frees: both are taken again.
    model.report = ModelCapacity(slots=5, waiting=0, replicas=1, mean_request_s=4.0)
    await runs.start_run("acme", "worker", "tidy up", principal=CAROL)
    await sessions.accept_turn("acme", session.id, "hello", principal=CAROL)


async def test_no_more_is_admitted_than_the_models_pace_serves_within_the_deadline(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> None:
    await fake_store.create_agent(Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS))
    await _held(fake_store, 4)
    # 17 places, but at 20 s a request, 3 calls a piece: 300 s ÷ 60 s = 5 pieces in time.
    model = _Reporting(ModelCapacity(slots=17, waiting=0, replicas=1, mean_request_s=20.0))
    admission = Admission(fake_store, model, 0, 60, deadline_s=300.0)
    runs, _ = _use_cases(gate, fake_store, settings, admission)
    await runs.start_run("acme", "worker", "the fifth", principal=CAROL)
    with pytest.raises(OverloadedError, match=r"5 turns and runs are in progress \(limit 5\)"):
        await runs.start_run("acme", "worker", "the sixth", principal=CAROL)
    model.report = ModelCapacity(slots=17, waiting=0, replicas=2, mean_request_s=20.0)
    await runs.start_run("acme", "worker", "two replicas serve twice as many", principal=CAROL)


async def test_the_setting_wins_and_no_report_means_no_limit(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> None:
    await fake_store.create_agent(Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS))
    await _held(fake_store, 2)
    silent = _Reporting(None)
    runs, _ = _use_cases(gate, fake_store, settings, Admission(fake_store, silent, 0, 60))
    await runs.start_run("acme", "worker", "no limit known", principal=CAROL)
    runs, _ = _use_cases(gate, fake_store, settings, Admission(fake_store, silent, 3, 60))
    with pytest.raises(OverloadedError) as e:
        await runs.start_run("acme", "worker", "over the setting", principal=CAROL)
    assert e.value.retry_after_s == 5  # the model's pace unknown
    # A model that cannot report (a plain client) leaves only the setting.
    runs, _ = _use_cases(gate, fake_store, settings, Admission(fake_store, None, 10, 60))
    await runs.start_run("acme", "worker", "under the setting", principal=CAROL)


async def test_a_request_that_is_wrong_says_so_before_admission(
    gate: AccessGate[FakeTransaction], fake_store: FakeStore, settings: Settings
) -> None:
    from cortex_ray._exceptions import InvalidRequestError

    await fake_store.create_agent(Agent(org_id="acme", name="worker", mode=AgentMode.AUTONOMOUS))
    await _held(fake_store, 1)
    runs, _ = _use_cases(gate, fake_store, settings, Admission(fake_store, None, 1, 60))
    with pytest.raises(InvalidRequestError, match="goal is empty"):
        await runs.start_run("acme", "worker", " ", principal=CAROL)
