"""An AUTONOMOUS agent over A2A: a message is a task run with the text as its goal; the
run's steps become status updates as its driver records them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID

from a2a.server.events.event_queue import Event
from a2a.types import Message
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from cortex_ray import Agent, RunStatus, TaskRun
from serve._deps import MAX_WAIT_S
from serve.a2a._call import A2ACall, a2a_error, door
from serve.a2a._convert import (
    CONTEXT_PREFIX,
    artifact_update,
    run_status_update,
    run_task,
    step_message,
)

__all__ = ["read_run", "run_events", "start_run", "wait_run"]

_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5


async def start_run(call: A2ACall, agent: Agent, message: Message, text: str) -> TaskRun:
    """Submit the run (acting for the caller; the client's ``contextId`` kept as its name)
    and hand it to the executor."""
    name = ""
    if message.context_id:
        if len(message.context_id) > 200 - len(CONTEXT_PREFIX) or "\x00" in message.context_id:
            raise InvalidParamsError("a contextId is at most 196 characters, without NUL")
        name = CONTEXT_PREFIX + message.context_id
    run = await door(
        call.api.runtime.start_run(
            call.org, agent.id, text, name=name, caller_id=call.principal.id,
            principal=call.principal,
        ),
        f"A2A run of {agent.name}",
    )  # fmt: skip
    try:
        await call.api.executor.start_run(call.org, run.id)
    except Exception as exc:  # recorded RUNNING: the supervisor resumes it
        raise a2a_error(exc, f"A2A run {run.id} handed to the executor") from exc
    return run


async def read_run(call: A2ACall, run_id: UUID) -> TaskRun:
    return await door(
        call.api.runtime.get_run(call.org, run_id, principal=call.principal),
        f"A2A task {run_id}",
        not_found=TaskNotFoundError(),
    )


async def _status(call: A2ACall, run_id: UUID) -> RunStatus:
    return await door(
        call.api.runtime.run_status(call.org, run_id, principal=call.principal),
        f"A2A task {run_id}",
        not_found=TaskNotFoundError(),
    )


async def wait_run(call: A2ACall, run: TaskRun) -> TaskRun:
    """Wait up to ``MAX_WAIT_S`` for the run to end (then it is returned as it stands:
    ``tasks/get`` follows it), polling only its status row (the HTTP long poll's way), with
    back-off; the whole run is read once at the end."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + MAX_WAIT_S, _POLL_FIRST_S
    status = run.status
    while not status.ended and (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, _POLL_MAX_S)
        status = await _status(call, run.id)
    return await read_run(call, run.id)


async def _run_states(call: A2ACall, run: TaskRun) -> AsyncIterator[TaskRun]:
    """The run each time it changes (a new step, a new status) until it ends. Read through
    the use case with back-off, so it follows a run wherever it is driven (here, a session
    actor, another replica); while the run waits for an approval (no step can come) only
    its status row is read."""
    delay = _POLL_FIRST_S
    seen = (run.status, len(run.steps))
    while not run.status.ended:
        await asyncio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)
        if run.status is RunStatus.AWAITING_APPROVAL and await _status(call, run.id) is run.status:
            continue
        run = await read_run(call, run.id)
        if (run.status, len(run.steps)) != seen:
            seen = (run.status, len(run.steps))
            delay = _POLL_FIRST_S
            yield run


async def run_events(call: A2ACall, run: TaskRun) -> AsyncIterator[Event]:
    """The run from now on: the task, a ``working`` update per step recorded, an update
    per change of status, then its artifact and final status."""
    yield run_task(run)
    told = len(run.steps)
    async for now in _run_states(call, run):
        new, told = now.steps[told:], len(now.steps)
        for step in new:
            yield run_status_update(now, step_message(now, step), working=True)
        if now.status.ended:
            if (artifact := artifact_update(run_task(now))) is not None:
                yield artifact
            yield run_status_update(now)
        elif not new:  # a change of status only (awaiting an approval, or back)
            yield run_status_update(now)
