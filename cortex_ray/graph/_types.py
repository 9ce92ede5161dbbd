"""The context graph's vocabulary at its boundaries: entities, facts, submissions, results."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "Entity",
    "Evidence",
    "ExtractionRun",
    "Fact",
    "GraphResult",
    "SubmitReport",
    "Triple",
]

_Type = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
_Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=2000, strip_whitespace=True, pattern=r"^[^\x00]+$"),
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Entity(_Frozen):
    """A thing the graph knows: its type, canonical name and aliases."""

    id: UUID
    type: str
    name: str
    aliases: tuple[str, ...] = ()
    recorded_at: datetime


class Evidence(_Frozen):
    """Where in a source version an assertion was read: byte range (0-based, end exclusive)
    and line range (1-based, inclusive) of the exact text."""

    byte_start: int
    byte_end: int
    line_start: int
    line_end: int


class Fact(_Frozen):
    """One relationship assertion with its provenance, both time axes and its citation."""

    id: int
    subject: Entity
    predicate: str
    object: Entity
    confidence: float
    method: str
    method_version: str
    source_id: UUID | None
    source_version: int | None
    collection: str | None
    path: str | None
    evidence: Evidence | None
    citation: str
    """``path:lines @vN`` for a source's fact; ``submitted by <principal>`` otherwise."""
    submitted_by: str | None
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    invalidated_at: datetime | None
    source_health: str | None = None
    """The source's last health event (``READ_OK``, ``READ_FAILURE``, ...), if it has one."""
    findings: tuple[str, ...] = ()
    """The unhealthy findings of the source's latest health report (``STALE``, ``DOWN``, ...)."""
    warning: str | None = None
    """Set when the source is not healthy: the fact may be out of date."""


class GraphResult(_Frozen):
    """What a graph search found: the seed entities, the facts within the budgets (each
    cited), every entity they touch, and the path when one was asked for."""

    seeds: list[Entity]
    entities: list[Entity]
    facts: list[Fact]
    path: list[Fact] | None = None
    truncated: bool = False
    """A budget stopped the expansion before the depth was reached."""
    warnings: list[str] = []


class Triple(BaseModel):
    """A fact a principal submits: subject, predicate, object, with optional aliases,
    confidence and valid time. ``functional`` declares that the predicate holds one object
    per subject at a time (then a newer triple closes the older one's validity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject_type: _Type
    subject: _Name
    predicate: _Type
    object_type: _Type
    object: _Name
    subject_aliases: tuple[_Name, ...] = Field(default=(), max_length=32)
    object_aliases: tuple[_Name, ...] = Field(default=(), max_length=32)
    functional: bool = False
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    valid_from: datetime | None = None


class SubmitReport(_Frozen):
    """What a write did: its extraction run, new entities and assertions, and how many
    assertions' validity it closed."""

    run_id: int
    entities: int
    assertions: int
    closed: int


class ExtractionRun(_Frozen):
    id: int
    method: str
    method_version: str
    collection: str | None
    status: str
    sources: int
    assertions: int
    detail: str
    started_at: datetime
    finished_at: datetime | None
