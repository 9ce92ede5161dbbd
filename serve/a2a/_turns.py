"""An INTERACTIVE agent over A2A: a message is a turn of the session its ``contextId``
names (a new session without one); the turn's events become status updates as they
happen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from uuid import UUID

from a2a.server.events.event_queue import Event
from a2a.types import Message, Task, TaskState
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from cortex_ray import Agent, TurnEvent, TurnEventKind, TurnResult, events_until
from cortex_ray.storage import TurnRecord
from serve.a2a._call import A2ACall, a2a_error, door
from serve.a2a._convert import (
    artifact_update,
    event_message,
    turn_status_update,
    turn_task,
    turn_task_id,
)

__all__ = ["accept_turn", "drive_turn", "ended_turn", "read_turn", "turn_events"]


async def accept_turn(call: A2ACall, agent: Agent, message: Message, text: str) -> TurnRecord:
    """Record the message as the next turn of the caller's session of ``agent`` (the one
    ``contextId`` names, else a new one)."""
    runtime, org = call.api.runtime, call.org
    if message.context_id:
        try:
            session_id = UUID(message.context_id)
        except ValueError:
            raise InvalidParamsError(
                f"contextId {message.context_id!r} is no session of {agent.name!r}: "
                "send without one to open a session"
            ) from None
        session = await door(
            runtime.get_session(org, session_id, principal=call.principal),
            f"A2A context {session_id}",
            not_found=InvalidParamsError(f"no session {session_id} (contextId)"),
        )
        if session.agent_id != agent.id:
            raise InvalidParamsError(f"contextId {session_id} is a session of another agent")
    else:
        session = await door(
            runtime.open_session(org, agent.id, call.principal), f"A2A session of {agent.name}"
        )
    return await door(
        runtime.accept_turn(org, session.id, text, principal=call.principal),
        f"A2A turn in session {session.id}",
    )


def drive_turn(
    call: A2ACall, turn: TurnRecord, on_event: Callable[[TurnEvent], None] | None
) -> asyncio.Future[TurnResult]:
    """Hand the accepted turn to the executor; it runs to its end even if the client goes
    away (held by the app's state, as the HTTP route's turns are)."""
    running = asyncio.ensure_future(
        call.api.executor.turn(
            call.org, turn.session_id, call.principal, turn.message,
            turn_id=turn.id, on_event=on_event,
        )
    )  # fmt: skip
    call.api.keep(running)
    return running


async def ended_turn(call: A2ACall, turn: TurnRecord, running: asyncio.Future[TurnResult]) -> Task:
    """The turn as stored once its driver returned. A driver that failed before the turn
    ended (its executor or actor unreachable: the supervisor resumes the turn later) is
    the A2A error the HTTP stream's ``error`` event would be; the turn's task id follows it
    with ``tasks/get``."""
    now = await read_turn(call, turn.session_id, turn.id)
    failed = None if running.cancelled() else running.exception()
    if failed is not None and not now.status.ended:
        raise a2a_error(failed, f"A2A turn {turn_task_id(turn)}")
    return turn_task(now)


async def read_turn(call: A2ACall, session_id: UUID, turn_id: UUID) -> TurnRecord:
    return await door(
        call.api.runtime.get_turn(call.org, session_id, turn_id, principal=call.principal),
        f"A2A task {session_id}:{turn_id}",
        not_found=TaskNotFoundError(),
    )


async def turn_events(call: A2ACall, turn: TurnRecord) -> AsyncIterator[Event]:
    """Drive the accepted turn and relay it: the task (submitted), ``working`` updates as
    its events happen, then its artifact and final status as stored."""
    yield turn_task(turn)
    events: asyncio.Queue[TurnEvent] = asyncio.Queue()
    running = drive_turn(call, turn, events.put_nowait)
    working = False
    async for event in events_until(running, events):
        if event.kind in (TurnEventKind.REPLY, TurnEventKind.REFUSED):
            continue  # the final task says it, once stored
        if not working:
            working = True
            yield turn_status_update(turn, TaskState.TASK_STATE_WORKING)
        yield turn_status_update(turn, TaskState.TASK_STATE_WORKING, event_message(turn, event))
    ended = await ended_turn(call, turn, running)
    if (artifact := artifact_update(ended)) is not None:
        yield artifact
    yield turn_status_update(turn, ended.status.state, ended.status.message)
