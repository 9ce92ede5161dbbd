"""The A2A request handler over the runtime: every A2A method is one or two use cases of
the door (``Runtime``) and the executor, as the HTTP routes call them, never the store.

An INTERACTIVE agent: a message is a turn of the session its ``contextId`` names (a new
session without one), its task the turn (``<sessionId>:<turnId>``). An AUTONOMOUS agent: a
message is a new task run with the text as its goal, its task the run. Streaming relays the
turn's events as they happen, and a run's steps as its driver records them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from cortex_ray import (
    Agent,
    AgentMode,
    CortexError,
    Principal,
    RunStatus,
    TaskRun,
    TurnEvent,
    TurnEventKind,
    TurnResult,
    events_until,
)
from cortex_ray.storage import TurnRecord
from serve._deps import MAX_WAIT_S, ApiState
from serve._errors import report
from serve.a2a._convert import (
    CONTEXT_PREFIX,
    TurnTaskId,
    artifact_update,
    event_message,
    parse_task_id,
    run_status_update,
    run_task,
    step_message,
    text_of,
    turn_status_update,
    turn_task,
)

__all__ = ["A2ACall", "RuntimeRequestHandler", "published"]

T = TypeVar("T")

_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5


@dataclass(frozen=True, slots=True)
class A2ACall:
    """Who calls which agent: set by the route (after the bearer key and the organisation
    are checked) in the call context's ``state["cortex"]``."""

    api: ApiState
    org: str
    agent_ref: str
    principal: Principal


def published(setting: str, agent: Agent) -> bool:
    """Whether the setting ``api.a2a_agents`` publishes the agent: ``*`` (every agent), or
    its name or id among the comma-separated entries."""
    names = {n.strip() for n in setting.split(",") if n.strip()}
    return "*" in names or agent.name in names or str(agent.id) in names


def _call(context: ServerCallContext) -> A2ACall:
    call = context.state.get("cortex")
    if not isinstance(call, A2ACall):  # only reachable through the route, which sets it
        raise InternalError("the A2A call has no caller")
    return call


def _a2a_error(exc: CortexError, what: str, *, not_found: A2AError | None = None) -> A2AError:
    """A refusal of the runtime as the A2A error a client can act on; ``data`` carries the
    API's status, code and correlation id."""
    problem = report(exc, what=what)
    data = {"status": problem.status, "code": problem.code, "correlationId": problem.correlation_id}
    if problem.status == 404 and not_found is not None:
        not_found.data = data
        return not_found
    kind: type[A2AError]
    if problem.status in (400, 422):
        kind = InvalidParamsError
    elif problem.status in (403, 404, 409):
        kind = InvalidRequestError
    else:
        kind = InternalError
    return kind(problem.message, data=data)


async def _door(work: Awaitable[T], what: str, *, not_found: A2AError | None = None) -> T:
    try:
        return await work
    except CortexError as exc:
        raise _a2a_error(exc, what, not_found=not_found) from exc


class RuntimeRequestHandler(RequestHandler):
    """A2A's ``RequestHandler`` on the runtime's use cases (one instance for every agent:
    the agent and caller come with each call)."""

    # agents -----------------------------------------------------------------------------

    async def _agent(self, call: A2ACall) -> Agent:
        unknown = InvalidRequestError(
            f"no published agent {call.agent_ref!r} in organisation {call.org!r}"
        )
        agent = await _door(
            call.api.runtime.get_agent(call.org, call.agent_ref, principal=call.principal),
            f"A2A agent {call.agent_ref!r}",
            not_found=unknown,
        )
        if not published(call.api.runtime.settings.api.a2a_agents, agent):
            raise unknown
        return agent

    # sending ----------------------------------------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        call = _call(context)
        agent = await self._agent(call)
        text = text_of(params.message)
        _no_follow_up(params.message)
        if agent.mode is AgentMode.INTERACTIVE:
            turn = await self._accept_turn(call, agent, params.message, text)
            running = self._drive_turn(call, turn, None)
            if params.configuration.return_immediately:
                return turn_task(turn)
            await asyncio.wait([running])
            return turn_task(await self._turn(call, turn.session_id, turn.id))
        run = await self._start_run(call, agent, params.message, text)
        if not params.configuration.return_immediately:
            run = await self._wait_run(call, run)
        return run_task(run)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        call = _call(context)
        agent = await self._agent(call)
        text = text_of(params.message)
        _no_follow_up(params.message)
        if agent.mode is AgentMode.INTERACTIVE:
            turn = await self._accept_turn(call, agent, params.message, text)
            async for event in self._turn_events(call, turn):
                yield event
            return
        run = await self._start_run(call, agent, params.message, text)
        async for event in self._run_events(call, run):
            yield event

    # interactive: turns -----------------------------------------------------------------

    async def _accept_turn(
        self, call: A2ACall, agent: Agent, message: Message, text: str
    ) -> TurnRecord:
        runtime, org = call.api.runtime, call.org
        if message.context_id:
            try:
                session_id = UUID(message.context_id)
            except ValueError:
                raise InvalidParamsError(
                    f"contextId {message.context_id!r} is no session of {agent.name!r}: "
                    "send without one to open a session"
                ) from None
            session = await _door(
                runtime.get_session(org, session_id, principal=call.principal),
                f"A2A context {session_id}",
                not_found=InvalidParamsError(f"no session {session_id} (contextId)"),
            )
            if session.agent_id != agent.id:
                raise InvalidParamsError(f"contextId {session_id} is a session of another agent")
        else:
            session = await _door(
                runtime.open_session(org, agent.id, call.principal), f"A2A session of {agent.name}"
            )
        return await _door(
            runtime.accept_turn(org, session.id, text, principal=call.principal),
            f"A2A turn in session {session.id}",
        )

    def _drive_turn(
        self, call: A2ACall, turn: TurnRecord, on_event: Callable[[TurnEvent], None] | None
    ) -> asyncio.Future[TurnResult]:
        """Hand the accepted turn to the executor; it runs to its end even if the client
        goes away (held by the app's state, as the HTTP route's turns are)."""
        running = asyncio.ensure_future(
            call.api.executor.turn(
                call.org, turn.session_id, call.principal, turn.message,
                turn_id=turn.id, on_event=on_event,
            )
        )  # fmt: skip
        call.api.keep(running)
        return running

    async def _turn(self, call: A2ACall, session_id: UUID, turn_id: UUID) -> TurnRecord:
        return await _door(
            call.api.runtime.get_turn(call.org, session_id, turn_id, principal=call.principal),
            f"A2A task {session_id}:{turn_id}",
            not_found=TaskNotFoundError(),
        )

    async def _turn_events(self, call: A2ACall, turn: TurnRecord) -> AsyncIterator[Event]:
        yield turn_task(turn)  # submitted
        events: asyncio.Queue[TurnEvent] = asyncio.Queue()
        running = self._drive_turn(call, turn, events.put_nowait)
        working = False
        async for event in events_until(running, events):
            if event.kind in (TurnEventKind.REPLY, TurnEventKind.REFUSED):
                continue  # the final task says it, once stored
            if not working:
                working = True
                yield turn_status_update(turn, TaskState.TASK_STATE_WORKING)
            yield turn_status_update(turn, TaskState.TASK_STATE_WORKING, event_message(turn, event))
        ended = turn_task(await self._turn(call, turn.session_id, turn.id))
        if (artifact := artifact_update(ended)) is not None:
            yield artifact
        yield turn_status_update(turn, ended.status.state, ended.status.message)

    # autonomous: runs -------------------------------------------------------------------

    async def _start_run(self, call: A2ACall, agent: Agent, message: Message, text: str) -> TaskRun:
        name = ""
        if message.context_id:
            if len(message.context_id) > 200 - len(CONTEXT_PREFIX) or "\x00" in message.context_id:
                raise InvalidParamsError("a contextId is at most 196 characters, without NUL")
            name = CONTEXT_PREFIX + message.context_id
        run = await _door(
            call.api.runtime.start_run(
                call.org, agent.id, text, name=name, caller_id=call.principal.id,
                principal=call.principal,
            ),
            f"A2A run of {agent.name}",
        )  # fmt: skip
        await call.api.executor.start_run(call.org, run.id)
        return run

    async def _run(self, call: A2ACall, run_id: UUID) -> TaskRun:
        return await _door(
            call.api.runtime.get_run(call.org, run_id, principal=call.principal),
            f"A2A task {run_id}",
            not_found=TaskNotFoundError(),
        )

    async def _wait_run(self, call: A2ACall, run: TaskRun) -> TaskRun:
        """Wait up to ``MAX_WAIT_S`` for the run to end (then it is returned as it stands:
        ``tasks/get`` follows it), polling only its status row (the HTTP long poll's way),
        with back-off; the whole run is read once at the end."""
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + MAX_WAIT_S, _POLL_FIRST_S
        status = run.status
        while not status.ended and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX_S)
            status = await _door(
                call.api.runtime.run_status(call.org, run.id, principal=call.principal),
                f"A2A task {run.id}",
                not_found=TaskNotFoundError(),
            )
        return await self._run(call, run.id)

    async def _run_states(self, call: A2ACall, run: TaskRun) -> AsyncIterator[TaskRun]:
        """The run each time it changes (a new step, a new status) until it ends. Read
        through the use case with back-off, so it follows a run wherever it is driven
        (here, a session actor, another replica); while the run waits for an approval
        (no step can come) only its status row is read."""
        delay = _POLL_FIRST_S
        seen = (run.status, len(run.steps))
        while not run.status.ended:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
            if run.status is RunStatus.AWAITING_APPROVAL:
                status = await _door(
                    call.api.runtime.run_status(call.org, run.id, principal=call.principal),
                    f"A2A task {run.id}",
                    not_found=TaskNotFoundError(),
                )
                if status is run.status:
                    continue
            run = await self._run(call, run.id)
            if (run.status, len(run.steps)) != seen:
                seen = (run.status, len(run.steps))
                delay = _POLL_FIRST_S
                yield run

    async def _run_events(self, call: A2ACall, run: TaskRun) -> AsyncIterator[Event]:
        yield run_task(run)
        told = len(run.steps)
        async for now in self._run_states(call, run):
            new, told = now.steps[told:], len(now.steps)
            for step in new:
                yield run_status_update(now, step_message(now, step), working=True)
            if now.status.ended:
                if (artifact := artifact_update(run_task(now))) is not None:
                    yield artifact
                yield run_status_update(now)
            elif not new:  # a change of status only (awaiting an approval, or back)
                yield run_status_update(now)

    # tasks ------------------------------------------------------------------------------

    async def _task_of(self, call: A2ACall, task_id: str) -> TaskRun | TurnRecord:
        agent = await self._agent(call)
        found = parse_task_id(task_id)
        if found is None:
            raise TaskNotFoundError()
        if isinstance(found, TurnTaskId):
            session = await _door(
                call.api.runtime.get_session(call.org, found.session_id, principal=call.principal),
                f"A2A task {task_id}",
                not_found=TaskNotFoundError(),
            )
            if session.agent_id != agent.id:
                raise TaskNotFoundError()
            return await self._turn(call, found.session_id, found.turn_id)
        run = await self._run(call, found)
        if run.agent_id != agent.id:
            raise TaskNotFoundError()
        return run

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        found = await self._task_of(_call(context), params.id)
        return run_task(found) if isinstance(found, TaskRun) else turn_task(found)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        call = _call(context)
        found = await self._task_of(call, params.id)
        if isinstance(found, TurnRecord):
            raise TaskNotCancelableError(
                "a turn of a session runs to its end; it cannot be canceled"
            )
        if found.status.ended:
            raise TaskNotCancelableError(f"the task has ended ({found.status.value})")
        run = await _door(
            call.api.runtime.cancel_run(
                call.org, found.id, principal=call.principal, reason="canceled over A2A"
            ),
            f"A2A cancel of {found.id}",
            not_found=TaskNotFoundError(),
        )
        return run_task(run)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        call = _call(context)
        agent = await self._agent(call)
        if agent.mode is AgentMode.INTERACTIVE:
            raise UnsupportedOperationError(
                "tasks/list lists the runs of an AUTONOMOUS agent; read a session's turns "
                "with tasks/get"
            )
        size = min(params.page_size or 50, 100)
        runs = await _door(
            call.api.runtime.list_runs(
                call.org, agent_ref=agent.id, limit=size, principal=call.principal
            ),
            f"A2A task list of {agent.name}",
        )
        tasks = [run_task(r) for r in runs]
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        return ListTasksResponse(tasks=tasks, page_size=size, total_size=len(tasks))

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        call = _call(context)
        found = await self._task_of(call, params.id)
        if isinstance(found, TurnRecord):
            raise UnsupportedOperationError(
                "a turn's events are replayed by GET /api/orgs/{org}/sessions/{id}/turns/"
                "{turnId}/events; subscribe to runs here"
            )
        async for event in self._run_events(call, found):
            yield event

    # not offered ------------------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError(
            "the card is already read with the bearer key: there is no extended card"
        )


def _no_follow_up(message: Message) -> None:
    if message.task_id:
        raise UnsupportedOperationError(
            "a cortex-ray task takes no further messages: send a new message (with the same "
            "contextId to continue a session)"
        )
