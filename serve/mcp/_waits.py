"""A run followed for a bounded time, each new step reported as an MCP progress notification.

The run is read back through the door (``Runtime.get_run``, the ``tasks.get`` use case), so
wherever it is driven (this process, a session actor, another replica) what is reported is
what the store holds. Reading it stops the wait only: the run goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from cortex_ray import Principal, RunStatus, Runtime, Step, TaskRun
from serve.schemas.runs import from_run

__all__ = ["follow_run", "run_body"]

_FIRST_POLL_S = 0.05
_MAX_POLL_S = 0.5


class Progress(Protocol):
    """What reports progress (``mcp``'s ``Context``: a no-op unless the client sent a
    progress token)."""

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None: ...


def _describe(step: Step) -> str:
    what = step.action.tool if step.action is not None else step.decision.value
    return f"step {step.step_index + 1}: {what}"


async def follow_run(
    runtime: Runtime,
    principal: Principal,
    run: TaskRun,
    wait_s: float,
    progress: Progress,
    *,
    seen: int,
) -> TaskRun:
    """Wait up to ``wait_s`` for a RUNNING ``run`` to leave RUNNING (it ends, or waits for an
    approval), reporting each step after the first ``seen`` as progress (of ``max_steps``).
    Returns the run as it then stands."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = _FIRST_POLL_S
    while True:
        for step in run.steps[seen:]:
            await progress.report_progress(step.step_index + 1, run.max_steps, _describe(step))
        seen = max(seen, len(run.steps))
        left = deadline - loop.time()
        if run.status is not RunStatus.RUNNING or left <= 0:
            return run
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, _MAX_POLL_S)
        run = await runtime.get_run(run.org_id, run.id, principal=principal)


def run_body(run: TaskRun) -> dict[str, Any]:
    """The run as ``GET /api/orgs/{org}/tasks/{id}`` renders it, and whether it is done
    (COMPLETED, FAILED or CANCELLED: nothing more will happen without a person)."""
    body: dict[str, Any] = from_run(run).model_dump(mode="json", by_alias=True)
    body["done"] = run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
    return body
