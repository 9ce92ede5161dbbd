"""Loop watching: a run that proposes the same call again and again is said to loop (it is
not stopped: the step budget bounds it, and an operator decides)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from cortex_ray._types import Agent, DecisionKind, RunLoop, Step, TaskRun
from cortex_ray.observability import diagnostics, metrics

__all__ = ["LoopWatch", "report_loop"]

log = logging.getLogger("cortex_ray.cycle")


class LoopWatch:
    """Counts the calls of a run by (tool, arguments); the ``repeats``-th identical one is a
    loop (reported once per call, then its count kept up to date)."""

    def __init__(self, repeats: int, steps: Sequence[Step]) -> None:
        self._repeats = repeats
        self._seen: dict[tuple[str, str], RunLoop] = {}
        self.loops: list[RunLoop] = []
        for step in steps:
            self.see(step, report=False)

    def see(self, step: Step, *, report: bool = True) -> RunLoop | None:
        action = step.action
        if step.decision is not DecisionKind.ACT or action is None:
            return None
        canonical = json.dumps(action.args, sort_keys=True, default=str)
        key = (action.tool, hashlib.sha256(canonical.encode()).hexdigest()[:16])
        known = self._seen.get(key)
        if known is None:
            self._seen[key] = RunLoop(
                tool=action.tool,
                args_sha=key[1],
                repeats=1,
                first_step=step.step_index,
                last_step=step.step_index,
            )
            return None
        seen = known.model_copy(update={"repeats": known.repeats + 1, "last_step": step.step_index})
        self._seen[key] = seen
        if seen.repeats < self._repeats:
            return None
        self.loops = [lp for lp in self.loops if (lp.tool, lp.args_sha) != key] + [seen]
        return seen if seen.repeats == self._repeats and report else None


def report_loop(agent: Agent, run: TaskRun, span: Any, loop: RunLoop) -> None:
    """Say that the run proposes the same call again and again: the log, a metric, the
    attempt's timeline and its span."""
    log.warning(
        "run %s: %s called %d times with the same arguments (steps %d-%d): a loop",
        run.id,
        loop.tool,
        loop.repeats,
        loop.first_step,
        loop.last_step,
    )
    metrics.record(metrics.LOOPS_DETECTED, org=run.org_id, agent=agent.name, tool=loop.tool)
    diagnostics.note("loop", **loop.model_dump(mode="json"))
    if span.is_recording():
        span.add_event("loop", {"cortex.tool": loop.tool, "cortex.repeats": loop.repeats})
