"""Traces and diagnostic timelines, of runs and of turns alike."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from cortex_ray.observability import RunTrace
from cortex_ray.observability.diagnostics import Diagnosis
from serve.schemas._common import _Out
from serve.schemas.runs import RunCostBody


class TraceSpanBody(_Out):
    """One span of a run's trace (OpenTelemetry, GenAI semantic conventions)."""

    trace_id: str = Field(description="W3C trace id, 32 hex digits")
    span_id: str = Field(description="16 hex digits")
    parent_span_id: str | None
    name: str = Field(
        description="invoke_agent {agent}, step N, perceive, decide, propose, "
        "execute_tool {tool}, learn, chat {model}, embeddings {model}, ..."
    )
    kind: str
    start_time: datetime
    end_time: datetime
    duration_ms: float
    status: str = Field(description="UNSET, OK or ERROR")
    status_message: str | None
    attributes: dict[str, Any] = Field(description="gen_ai.* and cortex.* attributes")
    depth: int = Field(description="depth in the tree (0: a root)")


def _span_bodies(found: RunTrace) -> list[TraceSpanBody]:
    return [TraceSpanBody.model_validate(s.model_dump(exclude={"links"})) for s in found.spans]


class TaskTrace(_Out):
    """A run's locally kept trace, spans depth-first in start order (empty when spans go
    only to a collector)."""

    task_id: UUID
    trace_ids: list[str]
    spans: list[TraceSpanBody]

    @classmethod
    def of(cls, found: RunTrace) -> TaskTrace:
        return cls(task_id=found.run_id, trace_ids=found.trace_ids, spans=_span_bodies(found))


class DiagnosticEventBody(_Out):
    """One event of a diagnostic timeline (its data scrubbed and bounded when written)."""

    seq: int = Field(description="order within the attempt or turn (1, 2, ...)")
    at: datetime
    kind: str = Field(
        description="attempt, request, model_call, decision, tool_call, retrieval, stall, "
        "loop, terminal, failure, truncated"
    )
    step: int | None = Field(description="the step of a run it belongs to")
    data: dict[str, Any]


class DiagnosticsBody(_Out):
    """A run's or a turn's diagnostic timeline (docs/operations.md, "Diagnostics")."""

    id: UUID = Field(description="the run's id, or the turn's")
    status: str
    stalled: bool = Field(description="a model call has not answered past the stall threshold")
    stalls: int
    loops: int
    cost: RunCostBody | None = Field(description="a run's cost (null for a turn)")
    events: list[DiagnosticEventBody]

    @classmethod
    def of(cls, found: Diagnosis) -> DiagnosticsBody:
        return cls.model_validate(found.model_dump())


class TurnTrace(_Out):
    """The locally kept trace a turn belongs to: the request it was accepted in and the
    turn's spans, wherever it was driven (empty for a turn accepted without tracing)."""

    turn_id: UUID
    trace_ids: list[str]
    spans: list[TraceSpanBody]

    @classmethod
    def of(cls, found: RunTrace) -> TurnTrace:
        return cls(turn_id=found.run_id, trace_ids=found.trace_ids, spans=_span_bodies(found))
