"""How runs and turns read as A2A tasks, how a message's parts read as the runtime's text,
which agents a setting publishes: the mapping alone, without a database or a server
(tests/test_a2a.py drives it end to end)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from a2a.types import Message, Part, Role, Task, TaskState
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.struct_pb2 import Value

from cortex_ray import (
    ActionType,
    Agent,
    AgentAction,
    DecisionKind,
    Observation,
    ObservationStatus,
    RunStatus,
    Step,
    TaskRun,
    TurnEvent,
    TurnEventKind,
)
from cortex_ray.storage import TurnRecord, TurnStatus
from serve.a2a import published
from serve.a2a._convert import (
    event_message,
    parse_task_id,
    run_context_id,
    run_task,
    step_message,
    text_of,
    turn_task,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def run(status: RunStatus, *, steps: int = 0, **fields: object) -> TaskRun:
    run_id = uuid.uuid4()
    made = [
        Step(
            run_id=run_id,
            step_index=i,
            decision=DecisionKind.ACT,
            action=AgentAction(tool="current_time"),
            observation=Observation(
                tool="current_time",
                action_type=ActionType.GROUNDING,
                status=ObservationStatus.OK,
                summary="12:00",
            ),
        )
        for i in range(steps)
    ]
    return TaskRun(
        id=run_id, org_id="acme", agent_id=uuid.uuid4(), goal="tell the time",
        max_steps=8, status=status, steps=tuple(made), **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def turn(status: TurnStatus, **fields: object) -> TurnRecord:
    return TurnRecord(
        id=uuid.uuid4(), org_id="acme", session_id=uuid.uuid4(), ordinal=1, caller_id="ada",
        message="hello", status=status, accepted_at=NOW, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_calls_progress_reads_as_one_line_each() -> None:
    t = turn(TurnStatus.RUNNING)
    said = [
        event_message(
            t,
            TurnEvent(
                kind=TurnEventKind.PROGRESS,
                round=0,
                tool="live__count",
                progress=i,
                total=3,
                text=f"step {i}",
            ),
        )
        for i in (1, 2)
    ]
    assert ["".join(p.text for p in m.parts) for m in said] == [
        "live__count: 1/3 step 1",
        "live__count: 2/3 step 2",
    ]
    assert said[0].message_id != said[1].message_id


def status_text(task: Task) -> str:
    return "".join(p.text for p in task.status.message.parts)


def test_a_runs_status_is_the_tasks_state() -> None:
    assert run_task(run(RunStatus.RUNNING)).status.state == TaskState.TASK_STATE_SUBMITTED
    working = run_task(run(RunStatus.RUNNING, steps=1))
    assert working.status.state == TaskState.TASK_STATE_WORKING and not working.artifacts
    waiting = run_task(run(RunStatus.AWAITING_APPROVAL, steps=1))
    assert waiting.status.state == TaskState.TASK_STATE_WORKING
    assert "approval" in status_text(waiting)
    done = run_task(run(RunStatus.COMPLETED, steps=1, result="It is noon."))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for p in done.artifacts[0].parts] == ["It is noon."]
    assert done.artifacts[0].name == "result" and status_text(done) == "It is noon."
    failed = run_task(run(RunStatus.FAILED, reason="step budget exhausted"))
    assert failed.status.state == TaskState.TASK_STATE_FAILED and not failed.artifacts
    assert status_text(failed) == "step budget exhausted"
    canceled = run_task(run(RunStatus.CANCELLED, reason="cancelled by ada"))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert [m.parts[0].text for m in done.history] == ["tell the time"]
    assert done.history[0].role == Role.ROLE_USER
    assert dict(done.metadata)["cortexRay"]["status"] == "COMPLETED"


def test_a_runs_context_is_the_one_its_client_gave() -> None:
    plain = run(RunStatus.RUNNING)
    assert run_context_id(plain) == str(plain.id)
    named = run(RunStatus.RUNNING, name="a2a:ctx-7")
    assert run_context_id(named) == "ctx-7" and run_task(named).context_id == "ctx-7"
    assert run_context_id(run(RunStatus.RUNNING, name="nightly")) != "nightly"


def test_a_step_reads_as_one_line() -> None:
    r = run(RunStatus.RUNNING, steps=1)
    assert step_message(r, r.steps[0]).parts[0].text == "step 0: current_time → OK: 12:00"


def test_a_turns_status_is_the_tasks_state() -> None:
    accepted = turn_task(turn(TurnStatus.ACCEPTED))
    assert accepted.status.state == TaskState.TASK_STATE_SUBMITTED
    assert turn_task(turn(TurnStatus.RUNNING)).status.state == TaskState.TASK_STATE_WORKING
    t = turn(TurnStatus.DONE, reply="hi ada", finished_at=NOW)
    done = turn_task(t)
    assert done.id == f"{t.session_id}:{t.id}" and done.context_id == str(t.session_id)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED and status_text(done) == "hi ada"
    assert [m.parts[0].text for m in done.history] == ["hello", "hi ada"]
    assert [m.role for m in done.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    assert done.artifacts[0].name == "reply"
    refused = turn_task(turn(TurnStatus.DONE, refused="not allowed"))
    assert refused.status.state == TaskState.TASK_STATE_REJECTED
    assert status_text(refused) == "not allowed" and not refused.artifacts
    failed = turn_task(turn(TurnStatus.FAILED, reason="deadline"))
    assert failed.status.state == TaskState.TASK_STATE_FAILED and status_text(failed) == "deadline"


def test_task_ids_name_a_run_or_a_turn() -> None:
    run_id, session_id, turn_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert parse_task_id(str(run_id)) == run_id
    found = parse_task_id(f"{session_id}:{turn_id}")
    assert not isinstance(found, uuid.UUID) and found is not None
    assert (found.session_id, found.turn_id) == (session_id, turn_id)
    for nonsense in ("", "x", "x:y", f"{run_id}:x"):
        assert parse_task_id(nonsense) is None


def message(*parts: Part) -> Message:
    return Message(message_id="m", role=Role.ROLE_USER, parts=list(parts))


def test_a_messages_text_and_data_parts_are_its_text() -> None:
    data = Value()
    data.struct_value.update({"b": 1, "a": "x"})
    assert text_of(message(Part(text="look"), Part(data=data))) == 'look\n{"a": "x", "b": 1.0}'
    with pytest.raises(ContentTypeNotSupportedError, match="url part"):
        text_of(message(Part(text="see"), Part(url="https://example.com/a.pdf")))
    with pytest.raises(ContentTypeNotSupportedError, match="raw part"):
        text_of(message(Part(raw=b"\x00")))
    with pytest.raises(InvalidParamsError, match="no text"):
        text_of(message(Part(text="  ")))
    with pytest.raises(InvalidParamsError, match="longer than"):
        text_of(message(Part(text="x" * 70_000)))


def test_which_agents_a_setting_publishes() -> None:
    helper = Agent(org_id="acme", name="helper")
    assert published("*", helper)
    assert published("worker, helper", helper)
    assert published(f" {helper.id} ", helper)
    assert not published("worker", helper)
    assert not published("", helper)
