"""Per-run and per-turn diagnostic timelines: what happened, in order, safe to show.

The cycle opens a :class:`Timeline` for each run attempt and each turn (``timeline(...)``,
bound to the task through a context variable); whatever runs inside notes events with
:func:`note`: the request, each model call's metadata (model, schema, tokens, time; never
the prompt), the candidates and their scores, the selected action, the tool's input and
result, the retrieval plan and the evidence ids, a stall, a loop, the terminal state or the
failure. Every event's data passes the one secret scrubber and a size cap before it is
kept; a timeline keeps at most ``max_events`` events (the rest are counted in a last
``truncated`` event). Events are written in batches (after a step once a second has passed
since the last write, at the end, and at once for a stall or a failure) to the
``diagnostics`` table, append-only; rows older than
the retention are deleted by the writer about once an hour.

Noting outside a timeline does nothing, so the seams (model client, gate, knowledge search)
note unconditionally.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from cortex_ray.observability._capture import bound_text
from cortex_ray.observability._scrub import scrub

__all__ = [
    "Diagnosis",
    "DiagnosticEvent",
    "Meter",
    "StallWatch",
    "Timeline",
    "current_timeline",
    "embedded",
    "model_call",
    "note",
    "timeline",
    "tool_call",
]

log = logging.getLogger("cortex_ray.diagnostics")


class DiagnosticEvent(BaseModel):
    """One event of a timeline, as stored and shown."""

    model_config = ConfigDict(frozen=True)

    seq: int
    at: datetime
    kind: str
    step: int | None = None
    data: dict[str, Any] = {}


Writer = Callable[["Timeline", list[DiagnosticEvent]], Awaitable[None]]


def _bounded(value: Any, limit: int) -> Any:
    """``value`` with every string cut to ``limit`` characters (after scrubbing)."""
    if value is None or type(value) in _SCALARS:
        return value  # first: the ABC checks below cost more than the rest
    if isinstance(value, str):
        return bound_text(value, limit)
    if isinstance(value, Mapping):
        return {str(k): _bounded(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        kept = [_bounded(v, limit) for v in value[:200]]
        if len(value) > 200:
            kept.append(f"[{len(value) - 200} more]")
        return kept
    if isinstance(value, (bool, int, float)):
        return value
    return bound_text(str(value), limit)


_SCALARS = frozenset({bool, int, float})
_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "DONE"})
"""The statuses of a run (and a turn: DONE) that nothing drives any more."""


@dataclass
class Meter:
    """What one run attempt or turn spent: tokens, and seconds in model and tool calls."""

    tokens_in: int = 0
    tokens_out: int = 0
    model_calls: int = 0
    model_s: float = 0.0
    embed_calls: int = 0
    embed_s: float = 0.0
    tool_calls: int = 0
    tool_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "model_calls": self.model_calls,
            "model_s": round(self.model_s, 4),
            "embed_calls": self.embed_calls,
            "embed_s": round(self.embed_s, 4),
            "tool_calls": self.tool_calls,
            "tool_s": round(self.tool_s, 4),
        }


@dataclass
class Timeline:
    """The events of one run attempt or one turn, written through ``writer``, and what it
    spent (``meter``)."""

    org_id: str
    writer: Writer
    run_id: UUID | None = None
    session_id: UUID | None = None
    turn_id: UUID | None = None
    max_events: int = 2000
    max_value_chars: int = 2000
    stall_after_s: float = 30.0
    step: int | None = None
    meter: Meter = field(default_factory=Meter)
    _pending: list[DiagnosticEvent] = field(default_factory=list)
    _count: int = 0
    _dropped: int = 0
    _flushed: float = field(default_factory=time.monotonic)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def add(self, kind: str, **data: Any) -> None:
        """Keep an event (scrubbed, bounded); beyond ``max_events`` only count it."""
        if self._count >= self.max_events:
            self._dropped += 1
            return
        self._count += 1
        clean = _bounded(
            scrub({k: v for k, v in data.items() if v is not None}), self.max_value_chars
        )
        self._pending.append(
            DiagnosticEvent(
                seq=self._count,
                at=datetime.now(UTC),
                kind=kind,
                step=self.step,
                data=clean,
            )
        )

    async def flush_if_due(self, every_s: float = 1.0) -> None:
        """Write what is pending if the last write is ``every_s`` old: fast steps share one
        write a second (a stall, a failure and the end are written at once)."""
        if self._pending and time.monotonic() - self._flushed >= every_s:
            await self.flush()

    async def flush(self) -> None:
        """Write what is pending (a failing write is logged: never the run's problem)."""
        async with self._lock:
            self._flushed = time.monotonic()
            if not self._pending:
                return
            batch, self._pending = self._pending, []
            try:
                await self.writer(self, batch)
            except Exception as exc:
                log.warning("could not keep %d diagnostic events: %s", len(batch), exc)

    async def close(self) -> None:
        if self._dropped:
            dropped, self._dropped = self._dropped, 0
            self._count = self.max_events - 1  # room for the last word
            self.add("truncated", dropped_events=dropped)
        await self.flush()


_CURRENT: contextvars.ContextVar[Timeline | None] = contextvars.ContextVar(
    "cortex_diagnostics", default=None
)


def current_timeline() -> Timeline | None:
    return _CURRENT.get()


@contextmanager
def timeline(bound: Timeline | None) -> Iterator[Timeline | None]:
    """Make ``bound`` the timeline events go to inside the block (``None``: none)."""
    token = _CURRENT.set(bound)
    try:
        yield bound
    finally:
        _CURRENT.reset(token)


def note(kind: str, **data: Any) -> None:
    """Add an event to the current timeline, if there is one (else nothing)."""
    found = _CURRENT.get()
    if found is not None:
        found.add(kind, **data)


class StallWatch:
    """Notes a ``stall`` event (and writes it at once) when a model call runs longer than
    the timeline's ``stall_after_s``; how long it finally took is in its ``model_call``
    event. Nothing without a timeline.

    A timer on the event loop, not a task made and cancelled around every model call (~2 µs
    less a call); the write it starts when it fires runs to its end even if the call
    answers meanwhile (a cancelled task could stop it half-way)."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._timer: asyncio.TimerHandle | None = None
        self._started = time.perf_counter()

    def _stalled(self, found: Timeline) -> None:
        found.add(
            "stall",
            model=self._model,
            running_s=round(time.perf_counter() - self._started, 1),
            threshold_s=found.stall_after_s,
        )
        log.warning(
            "a call to %s has run for %.0f s (stall): run %s, session %s",
            self._model,
            found.stall_after_s,
            found.run_id,
            found.session_id,
        )
        task = asyncio.get_running_loop().create_task(found.flush())
        _writing.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(_writing.discard)

    def __enter__(self) -> StallWatch:
        found = _CURRENT.get()
        if found is not None:
            self._timer = asyncio.get_running_loop().call_later(
                found.stall_after_s, self._stalled, found
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


_writing: set[asyncio.Task[None]] = set()


def model_call(
    model: str,
    *,
    schema: str,
    seconds: float,
    tokens_in: int = 0,
    tokens_out: int = 0,
    finish_reason: str | None = None,
    error: str | None = None,
) -> None:
    """A chat call's metadata (never its messages) on the current timeline and meter."""
    found = _CURRENT.get()
    if found is None:
        return
    found.meter.model_calls += 1
    found.meter.model_s += seconds
    found.meter.tokens_in += tokens_in
    found.meter.tokens_out += tokens_out
    found.add(
        "model_call",
        model=model,
        schema=schema,
        ms=round(seconds * 1000, 1),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        finish_reason=finish_reason,
        error=error,
    )


def embedded(seconds: float) -> None:
    """An embedding call: metered, not noted (there are many and they say little)."""
    found = _CURRENT.get()
    if found is not None:
        found.meter.embed_calls += 1
        found.meter.embed_s += seconds


def tool_call(
    tool: str,
    *,
    category: str,
    access: str,
    status: str,
    seconds: float,
    args: Any,
    output: Any,
    reason: str | None = None,
) -> None:
    """A call through the gate: its input and result (scrubbed, bounded) and how it went."""
    found = _CURRENT.get()
    if found is None:
        return
    found.meter.tool_calls += 1
    found.meter.tool_s += seconds
    found.add(
        "tool_call",
        tool=tool,
        category=category,
        access=access,
        status=status,
        ms=round(seconds * 1000, 1),
        args=args,
        output=output,
        reason=reason,
    )


class Diagnosis(BaseModel):
    """A run's or a turn's timeline as ``cortex-ray diagnose`` and the API show it."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    """The run's id (or the turn's)."""
    status: str
    stalled: bool
    """The latest model call has run past the stall threshold and has not answered yet."""
    stalls: int
    loops: int
    cost: dict[str, Any] | None = None
    events: list[DiagnosticEvent]

    @classmethod
    def of(
        cls,
        ident: UUID,
        status: str,
        events: list[DiagnosticEvent],
        cost: dict[str, Any] | None = None,
    ) -> Diagnosis:
        last_stall = max((i for i, e in enumerate(events) if e.kind == "stall"), default=-1)
        answered = any(e.kind in ("model_call", "terminal") for e in events[last_stall + 1 :])
        # A run or turn that ended (a cancel writes no terminal event) is not waiting on
        # anything, whatever its last stall.
        answered = answered or status in _ENDED
        return cls(
            id=ident,
            status=status,
            stalled=last_stall >= 0 and not answered,
            stalls=sum(e.kind == "stall" for e in events),
            loops=sum(e.kind == "loop" for e in events),
            cost=cost,
            events=events,
        )

    def lines(self) -> list[str]:
        """One line per event: time, step, kind and its main facts."""
        head = f"{self.id}: {self.status}"
        if self.stalled:
            head += " — STALLED: a model call has not answered past the stall threshold"
        if self.loops:
            head += f" — {self.loops} loop(s)"
        out = [head]
        if self.cost:
            out.append(
                "cost: " + ", ".join(f"{k}={v}" for k, v in self.cost.items() if k != "loops")
            )
        for e in self.events:
            step = "" if e.step is None else f"step {e.step} "
            out.append(f"{e.at:%H:%M:%S.%f}"[:-3] + f"  {step}{e.kind:<11} {_summary(e)}")
        return out


def _summary(e: DiagnosticEvent) -> str:
    d = e.data
    if e.kind == "model_call":
        what = f"{d.get('model')} [{d.get('schema')}] {d.get('ms')} ms"
        what += f", tokens {d.get('tokens_in', 0)}→{d.get('tokens_out', 0)}"
        return what + (f" ERROR {d['error']}" if d.get("error") else "")
    if e.kind == "tool_call":
        return (
            f"{d.get('tool')} [{d.get('category')}, {d.get('access')}] {d.get('status')} "
            f"{d.get('ms')} ms args={_short(d.get('args'))} → {_short(d.get('output'))}"
        )
    if e.kind == "decision":
        scores = [c.get("score") for c in d.get("candidates", [])]
        return f"{d.get('decision')} {_short(d.get('action'))} of {len(scores)} (scores {scores})"
    if e.kind == "retrieval":
        return f"{d.get('collections')} {d.get('fusion')} → {len(d.get('evidence', []))} hits"
    if e.kind == "stall":
        return (
            f"{d.get('model')} running {d.get('running_s')} s (threshold {d.get('threshold_s')} s)"
        )
    return _short(d, 160)


def _short(value: Any, limit: int = 80) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return bound_text(text, limit)
