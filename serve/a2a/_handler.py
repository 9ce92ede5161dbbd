"""The A2A request handler over the runtime: every A2A method is one or two use cases of
the door (``Runtime``) and the executor, as the HTTP routes call them, never the store.

An INTERACTIVE agent: a message is a turn of the session its ``contextId`` names (a new
session without one), its task the turn (``<sessionId>:<turnId>``; ``_turns``). An
AUTONOMOUS agent: a message is a new task run with the text as its goal, its task the run
(``_runs``). Streaming relays the turn's events as they happen, and a run's steps as its
driver records them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

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
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from cortex_ray import AgentMode, TaskRun
from cortex_ray.storage import TurnRecord
from serve.a2a._call import A2ACall, agent_of, call_of, door
from serve.a2a._convert import TurnTaskId, parse_task_id, run_task, text_of, turn_task
from serve.a2a._runs import read_run, run_events, start_run, wait_run
from serve.a2a._turns import accept_turn, drive_turn, ended_turn, read_turn, turn_events

__all__ = ["RuntimeRequestHandler"]


class RuntimeRequestHandler(RequestHandler):
    """A2A's ``RequestHandler`` on the runtime's use cases (one instance for every agent:
    the agent and caller come with each call)."""

    # sending ----------------------------------------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        call = call_of(context)
        agent = await agent_of(call)
        text = text_of(params.message)
        _no_follow_up(params.message)
        if agent.mode is AgentMode.INTERACTIVE:
            turn = await accept_turn(call, agent, params.message, text)
            running = drive_turn(call, turn, None)
            if params.configuration.return_immediately:
                return turn_task(turn)
            await asyncio.wait([running])
            return await ended_turn(call, turn, running)
        run = await start_run(call, agent, params.message, text)
        if not params.configuration.return_immediately:
            run = await wait_run(call, run)
        return run_task(run)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        call = call_of(context)
        agent = await agent_of(call)
        text = text_of(params.message)
        _no_follow_up(params.message)
        if agent.mode is AgentMode.INTERACTIVE:
            turn = await accept_turn(call, agent, params.message, text)
            async for event in turn_events(call, turn):
                yield event
            return
        run = await start_run(call, agent, params.message, text)
        async for event in run_events(call, run):
            yield event

    # tasks ------------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        found = await _task_of(call_of(context), params.id)
        return run_task(found) if isinstance(found, TaskRun) else turn_task(found)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        call = call_of(context)
        found = await _task_of(call, params.id)
        if isinstance(found, TurnRecord):
            raise TaskNotCancelableError(
                "a turn of a session runs to its end; it cannot be canceled"
            )
        if found.status.ended:
            raise TaskNotCancelableError(f"the task has ended ({found.status.value})")
        run = await door(
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
        call = call_of(context)
        agent = await agent_of(call)
        if agent.mode is AgentMode.INTERACTIVE:
            raise UnsupportedOperationError(
                "tasks/list lists the runs of an AUTONOMOUS agent; read a session's turns "
                "with tasks/get"
            )
        size = min(params.page_size or 50, 100)
        runs = await door(
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
        call = call_of(context)
        found = await _task_of(call, params.id)
        if isinstance(found, TurnRecord):
            raise UnsupportedOperationError(
                "a turn's events are replayed by GET /api/orgs/{org}/sessions/{id}/turns/"
                "{turnId}/events; subscribe to runs here"
            )
        async for event in run_events(call, found):
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


async def _task_of(call: A2ACall, task_id: str) -> TaskRun | TurnRecord:
    """The run or turn a task id names, if it belongs to the called agent."""
    agent = await agent_of(call)
    found = parse_task_id(task_id)
    if found is None:
        raise TaskNotFoundError()
    if isinstance(found, TurnTaskId):
        session = await door(
            call.api.runtime.get_session(call.org, found.session_id, principal=call.principal),
            f"A2A task {task_id}",
            not_found=TaskNotFoundError(),
        )
        if session.agent_id != agent.id:
            raise TaskNotFoundError()
        return await read_turn(call, found.session_id, found.turn_id)
    run = await read_run(call, found)
    if run.agent_id != agent.id:
        raise TaskNotFoundError()
    return run


def _no_follow_up(message: Message) -> None:
    if message.task_id:
        raise UnsupportedOperationError(
            "a cortex-ray task takes no further messages: send a new message (with the same "
            "contextId to continue a session)"
        )
