"""The runtime's records as A2A objects: an agent as its card, a task run or an interactive
turn as a ``Task``, their progress as status and artifact updates; and an A2A message's
parts as the text the runtime takes.

Ids: a run's task id is the run's id; a turn's task id is ``<sessionId>:<turnId>`` (a turn
is found through its session); a session's context id is the session's id; a run's context
id is the one its client sent (kept in the run's name, ``a2a:<contextId>``), else the run's
id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.json_format import MessageToDict

import cortex_ray
from cortex_ray import Agent, RunStatus, Step, TaskRun, ToolSpec, TurnEvent, TurnEventKind
from cortex_ray.storage import TurnRecord, TurnStatus

__all__ = [
    "BEARER",
    "CONTEXT_PREFIX",
    "TurnTaskId",
    "agent_card",
    "artifact_update",
    "event_message",
    "parse_task_id",
    "result_artifact",
    "run_context_id",
    "run_status_update",
    "run_task",
    "step_message",
    "text_of",
    "turn_status_update",
    "turn_task",
    "turn_task_id",
]

BEARER = "bearer"
"""The security scheme of every card: the API's bearer keys."""

CONTEXT_PREFIX = "a2a:"
"""A run's name when an A2A client gave it a context id: ``a2a:<contextId>``."""

_MAX_TEXT = 64 * 1024


# messages in ------------------------------------------------------------------------------


def text_of(message: Message) -> str:
    """The text a message carries: its text parts, and its data parts as JSON, one per
    line. Files (bytes or URLs) are refused: the runtime takes text."""
    pieces: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            pieces.append(part.text)
        elif kind == "data":
            data = MessageToDict(part)["data"]
            pieces.append(json.dumps(data, ensure_ascii=False, sort_keys=True))
        else:
            raise ContentTypeNotSupportedError(
                f"a {kind} part: cortex-ray agents take text and data parts only"
            )
    text = "\n".join(p for p in pieces if p.strip())
    if not text.strip():
        raise InvalidParamsError("the message has no text: send a text (or data) part")
    if len(text) > _MAX_TEXT:
        raise InvalidParamsError(f"the message is longer than {_MAX_TEXT} characters")
    return text


# ids ----------------------------------------------------------------------------------------


class TurnTaskId:
    """A turn's task id, taken apart: its session and its turn."""

    __slots__ = ("session_id", "turn_id")

    def __init__(self, session_id: UUID, turn_id: UUID) -> None:
        self.session_id = session_id
        self.turn_id = turn_id


def turn_task_id(turn: TurnRecord) -> str:
    return f"{turn.session_id}:{turn.id}"


def parse_task_id(task_id: str) -> UUID | TurnTaskId | None:
    """A run's id, a turn's (session, turn), or ``None`` for an id neither could be."""
    session, sep, turn = task_id.partition(":")
    try:
        if sep:
            return TurnTaskId(UUID(session), UUID(turn))
        return UUID(task_id)
    except ValueError:
        return None


def run_context_id(run: TaskRun) -> str:
    if run.name.startswith(CONTEXT_PREFIX) and len(run.name) > len(CONTEXT_PREFIX):
        return run.name[len(CONTEXT_PREFIX) :]
    return str(run.id)


# messages and tasks out ---------------------------------------------------------------------


def _message(role: Role, text: str, *, message_id: str, context_id: str, task_id: str) -> Message:
    return Message(
        message_id=message_id,
        context_id=context_id,
        task_id=task_id,
        role=role,
        parts=[Part(text=text, media_type="text/plain")],
    )


def _status(state: TaskState, when: datetime | None, message: Message | None = None) -> TaskStatus:
    status = TaskStatus(state=state, message=message)
    if when is not None:
        status.timestamp.FromDatetime(when)
    return status


def result_artifact(artifact_id: str, text: str, *, name: str) -> Artifact:
    return Artifact(
        artifact_id=artifact_id, name=name, parts=[Part(text=text, media_type="text/plain")]
    )


_RUN_STATES = {
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    # A person (an approver), not the A2A client, unblocks it: still working, said so.
    RunStatus.AWAITING_APPROVAL: TaskState.TASK_STATE_WORKING,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
}


def _run_state(run: TaskRun) -> TaskState:
    if run.status is RunStatus.RUNNING and not run.steps:
        return TaskState.TASK_STATE_SUBMITTED
    return _RUN_STATES[run.status]


def _run_status_text(run: TaskRun) -> str | None:
    if run.status is RunStatus.AWAITING_APPROVAL:
        return "waiting for a person's approval of a tool call"
    if run.status is RunStatus.COMPLETED:
        return run.result or ""
    if run.status.ended:
        return run.reason or run.status.value.lower()
    return None


def _run_status(run: TaskRun) -> TaskStatus:
    text = _run_status_text(run)
    message = None
    if text is not None:
        message = _message(
            Role.ROLE_AGENT,
            text,
            message_id=f"{run.id}:status",
            context_id=run_context_id(run),
            task_id=str(run.id),
        )
    return _status(_run_state(run), run.finished_at or run.created_at, message)


def run_task(run: TaskRun) -> Task:
    """A run as a task: its state from the run's status, the goal as the history's user
    message, the result (once COMPLETED) as the artifact ``result``."""
    context_id = run_context_id(run)
    goal = _message(
        Role.ROLE_USER, run.goal, message_id=f"{run.id}:goal", context_id=context_id,
        task_id=str(run.id),
    )  # fmt: skip
    task = Task(id=str(run.id), context_id=context_id, status=_run_status(run), history=[goal])
    if run.status is RunStatus.COMPLETED and run.result is not None:
        task.artifacts.append(result_artifact(f"{run.id}:result", run.result, name="result"))
    task.metadata.update({"cortexRay": {"kind": "run", "status": run.status.value}})
    return task


def run_status_update(
    run: TaskRun, message: Message | None = None, *, working: bool = False
) -> TaskStatusUpdateEvent:
    """The run's status now (``message``: a step's, instead of the status's own;
    ``working``: said as WORKING, for a step reported before the run's end)."""
    status = _run_status(run)
    if message is not None:
        status.message.CopyFrom(message)
    if working:
        status.state = TaskState.TASK_STATE_WORKING
    return TaskStatusUpdateEvent(task_id=str(run.id), context_id=run_context_id(run), status=status)


def step_message(run: TaskRun, step: Step) -> Message:
    """What one step of the run did, in a line."""
    if step.action is not None:
        text = f"step {step.step_index}: {step.action.tool}"
        if step.observation is not None:
            text += f" → {step.observation.status.value}: {step.observation.summary[:500]}"
    else:
        text = f"step {step.step_index}: {step.decision.value.lower()}"
    return _message(
        Role.ROLE_AGENT,
        text,
        message_id=f"{run.id}:step:{step.step_index}",
        context_id=run_context_id(run),
        task_id=str(run.id),
    )


_TURN_STATES = {
    TurnStatus.ACCEPTED: TaskState.TASK_STATE_SUBMITTED,
    TurnStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    TurnStatus.FAILED: TaskState.TASK_STATE_FAILED,
}


def turn_task(turn: TurnRecord) -> Task:
    """A turn as a task: the person's message and (once DONE) the reply as its history, the
    reply also as the artifact ``reply`` and the final status's message. A refused turn
    is REJECTED with the refusal as the status message; a failed one FAILED with why."""
    task_id, context_id = turn_task_id(turn), str(turn.session_id)
    history = [
        _message(
            Role.ROLE_USER, turn.message, message_id=f"{turn.id}:message",
            context_id=context_id, task_id=task_id,
        )
    ]  # fmt: skip
    message: Message | None = None
    artifacts: list[Artifact] = []
    if turn.status is TurnStatus.DONE and turn.reply is not None:
        state = TaskState.TASK_STATE_COMPLETED
        message = _message(
            Role.ROLE_AGENT, turn.reply, message_id=f"{turn.id}:reply", context_id=context_id,
            task_id=task_id,
        )  # fmt: skip
        history.append(message)
        artifacts.append(result_artifact(f"{turn.id}:reply", turn.reply, name="reply"))
    elif turn.status is TurnStatus.DONE:
        state = TaskState.TASK_STATE_REJECTED
        message = _message(
            Role.ROLE_AGENT, turn.refused or turn.reason or "no reply",
            message_id=f"{turn.id}:refused", context_id=context_id, task_id=task_id,
        )  # fmt: skip
    else:
        state = _TURN_STATES[turn.status]
        if turn.status is TurnStatus.FAILED:
            message = _message(
                Role.ROLE_AGENT, turn.reason or "the turn failed",
                message_id=f"{turn.id}:failed", context_id=context_id, task_id=task_id,
            )  # fmt: skip
    task = Task(
        id=task_id,
        context_id=context_id,
        status=_status(state, turn.finished_at or turn.accepted_at, message),
        history=history,
        artifacts=artifacts,
    )
    task.metadata.update({"cortexRay": {"kind": "turn", "status": turn.status.value}})
    return task


def event_message(turn: TurnRecord, event: TurnEvent) -> Message:
    """A turn's event (a tool call, its observation, an approval asked for) as the agent's
    status message."""
    if event.kind is TurnEventKind.TOOL_CALL:
        text = f"calling {event.tool}"
    elif event.kind is TurnEventKind.APPROVAL_REQUIRED:
        text = f"{event.tool} waits for a person's approval: {event.text or ''}".rstrip(": ")
    elif event.kind is TurnEventKind.OBSERVATION and event.observation is not None:
        obs = event.observation
        text = f"{obs.tool} → {obs.status.value}: {obs.summary[:500]}"
    elif event.kind is TurnEventKind.PROGRESS:
        of = "" if event.total is None else f"/{event.total:g}"
        text = f"{event.tool}: {event.progress or 0:g}{of} {event.text or ''}".rstrip()
    else:
        text = event.text or event.kind.value
    # Several progress events share a round: each its own message id.
    part = "" if event.kind is not TurnEventKind.PROGRESS else f":{event.progress or 0:g}"
    return _message(
        Role.ROLE_AGENT,
        text,
        message_id=f"{turn.id}:{event.kind.value}:{event.round}{part}",
        context_id=str(turn.session_id),
        task_id=turn_task_id(turn),
    )


def turn_status_update(
    turn: TurnRecord, state: TaskState, message: Message | None = None
) -> TaskStatusUpdateEvent:
    return TaskStatusUpdateEvent(
        task_id=turn_task_id(turn),
        context_id=str(turn.session_id),
        status=_status(state, None, message),
    )


def artifact_update(task: Task) -> TaskArtifactUpdateEvent | None:
    """The task's artifact (its reply or result) as one complete update, if it has one."""
    if not task.artifacts:
        return None
    return TaskArtifactUpdateEvent(
        task_id=task.id, context_id=task.context_id, artifact=task.artifacts[0], last_chunk=True
    )


# the card ---------------------------------------------------------------------------------


def agent_card(agent: Agent, tools: Sequence[ToolSpec], url: str) -> AgentCard:
    """The agent's card: name, persona as description, its skills and the tools the caller
    may use with it as skills, one JSON-RPC endpoint (A2A 1.0 and 0.3 on the same URL),
    streaming, and the API's bearer keys as its security."""
    skills = [
        AgentSkill(id=f"skill-{n}", name=skill[:80], description=skill, tags=["skill"])
        for n, skill in enumerate(agent.skills, start=1)
    ]
    skills += [
        AgentSkill(
            id=tool.name,
            name=tool.name,
            description=tool.description or tool.name,
            tags=["tool", tool.action_type.value.lower(), tool.tier.value.lower()],
        )
        for tool in tools
    ]
    mode = agent.mode.value.lower()
    description = agent.persona.strip() or f"a cortex-ray {mode} agent"
    return AgentCard(
        name=agent.name,
        description=description,
        version=cortex_ray.__version__,
        provider=AgentProvider(organization=agent.org_id, url=url),
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding=TransportProtocol.JSONRPC.value, protocol_version=v
            )
            for v in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            BEARER: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer",
                    bearer_format="cortex-ray API key (crx_…)",
                    description="an API key of the agent's organisation",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList()})],
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=skills,
    )
