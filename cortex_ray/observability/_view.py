"""A run's trace as people read it: spans in tree order, and a text waterfall."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

__all__ = ["RunTrace", "TraceSpan", "waterfall"]


class TraceSpan(BaseModel):
    """One finished span (what ``trace_spans`` keeps), with its depth in the tree."""

    model_config = ConfigDict(frozen=True)

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_time: datetime
    end_time: datetime
    duration_ms: float
    status: str
    status_message: str | None = None
    attributes: dict[str, Any] = {}
    links: list[dict[str, Any]] = []
    depth: int = 0


class RunTrace(BaseModel):
    """The locally kept traces of one run (one per attempt: a resumed run continues its
    trace, so usually one), or of one turn (``run_id`` is then the turn's id), spans
    depth-first in start order."""

    model_config = ConfigDict(frozen=True)

    run_id: UUID
    trace_ids: list[str]
    spans: list[TraceSpan]

    @classmethod
    def of(cls, run_id: UUID, rows: Iterable[Mapping[str, Any]]) -> RunTrace:
        spans = [
            TraceSpan(
                **{k: row[k] for k in TraceSpan.model_fields if k not in ("duration_ms", "depth")},
                duration_ms=(row["end_time"] - row["start_time"]).total_seconds() * 1000,
            )
            for row in rows
        ]
        ids = {s.span_id for s in spans}
        children: dict[str | None, list[TraceSpan]] = defaultdict(list)
        for s in spans:
            # a parent not kept here (another process's span not exported yet, or a
            # remote caller's) makes the span a root of what is shown
            children[s.parent_span_id if s.parent_span_id in ids else None].append(s)
        ordered: list[TraceSpan] = []

        def walk(span: TraceSpan, depth: int) -> None:
            ordered.append(span.model_copy(update={"depth": depth}))
            for child in sorted(children.get(span.span_id, []), key=lambda c: c.start_time):
                walk(child, depth + 1)

        for root in sorted(children[None], key=lambda s: s.start_time):
            walk(root, 0)
        trace_ids = list(dict.fromkeys(s.trace_id for s in ordered))
        return cls(run_id=run_id, trace_ids=trace_ids, spans=ordered)


def _label(span: TraceSpan) -> str:
    category = span.attributes.get("cortex.action_type")
    access = span.attributes.get("cortex.access")
    extra = [str(x) for x in (category, access) if x]
    return "  " * span.depth + span.name + (f" [{', '.join(extra)}]" if extra else "")


def waterfall(trace: RunTrace, *, width: int = 40) -> list[str]:
    """One line per span: the tree (indented name, the action category and access decision
    of tool spans), status, duration, and a bar placing it in the trace's time."""
    if not trace.spans:
        return []
    start = min(s.start_time for s in trace.spans)
    end = max(s.end_time for s in trace.spans)
    total = max((end - start).total_seconds(), 1e-9)
    labels = [_label(s) for s in trace.spans]
    name_width = min(max(len(label) for label in labels), 60)
    lines = []
    for span, label in zip(trace.spans, labels, strict=True):
        left = int((span.start_time - start).total_seconds() / total * width)
        size = max(1, round(span.duration_ms / 1000 / total * width))
        bar = " " * left + "█" * min(size, width - left)
        status = "ERROR" if span.status == "ERROR" else "ok"
        name = label[:name_width]
        lines.append(
            f"{name:<{name_width}}  {status:<5} {span.duration_ms:9.1f} ms  |{bar:<{width}}|"
        )
    return lines
