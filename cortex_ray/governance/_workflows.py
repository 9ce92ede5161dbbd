"""Workflow definitions and their immutable versions (issue 18, point 5): the vocabulary, the
checks a version and a run's inputs pass, and the SQL. Every statement filters by
organisation.

A version says what a run of it may do: the tools (by name) and connectors (every tool of
one) the gate lets through, the approval gates (tools, tiers, and what the risk level
implies), the evidence a run must have cited to complete, and the default run mode, which a
run may only make safer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid4

import jsonschema
import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._exceptions import ConflictError, InvalidRequestError, NotFoundError
from cortex_ray._types import CapabilityTier, RunMode, utcnow
from cortex_ray.governance._patterns import (
    InputLimits,
    PatternTimeout,
    bounded_validator,
    check_patterns,
)
from cortex_ray.storage import Database

__all__ = [
    "EvidenceCheck",
    "RequiredEvidence",
    "RiskLevel",
    "Workflow",
    "WorkflowAcceptance",
    "WorkflowStore",
    "WorkflowVersion",
    "WorkflowVersionSpec",
    "check_evidence",
    "check_input_schema",
    "check_inputs",
    "evidence_of",
    "run_mode_for",
]

MAX_SCHEMA_BYTES = 64 * 1024
_LIMITS = InputLimits()
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,99}$"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RiskLevel(StrEnum):
    """How much a workflow's calls can harm. ``high`` makes every ADMIN call wait for a
    person's approval, ``critical`` every WRITE and ADMIN call (besides the version's own
    approval gates); ``low`` and ``medium`` are labels only."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


_IMPLIED_APPROVAL = {
    RiskLevel.LOW: frozenset[CapabilityTier](),
    RiskLevel.MEDIUM: frozenset[CapabilityTier](),
    RiskLevel.HIGH: frozenset({CapabilityTier.ADMIN}),
    RiskLevel.CRITICAL: frozenset({CapabilityTier.WRITE, CapabilityTier.ADMIN}),
}


class RequiredEvidence(_Model):
    """What a run must have cited, from the results of the calls that ran, to complete.

    Attributes:
        min_sources: At least this many distinct source ids (``source_id`` keys in results,
            as the audit row keeps them).
        sources: Each of these source ids must be among them.
    """

    min_sources: int = Field(default=0, ge=0, le=1000)
    sources: tuple[str, ...] = Field(default=(), max_length=100)

    @property
    def required(self) -> bool:
        return self.min_sources > 0 or bool(self.sources)


class WorkflowVersionSpec(_Model):
    """What a new version says (the caller's input); see ``WorkflowVersion``."""

    instructions: str = Field(min_length=1, max_length=20_000)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    tools: tuple[str, ...] = Field(default=(), max_length=200)
    connectors: tuple[str, ...] = Field(default=(), max_length=100)
    required_evidence: RequiredEvidence = Field(default_factory=RequiredEvidence)
    risk: RiskLevel = RiskLevel.LOW
    approval_tools: tuple[str, ...] = Field(default=(), max_length=200)
    approval_tiers: tuple[CapabilityTier, ...] = ()
    default_mode: RunMode = RunMode.EXECUTE

    def canonical(self) -> str:
        """The spec as canonical JSON (publishing the same spec again is not a change)."""
        data = self.model_dump(mode="json")
        for key in ("tools", "connectors", "approval_tools", "approval_tiers"):
            data[key] = sorted(set(data[key]))
        data["required_evidence"]["sources"] = sorted(set(data["required_evidence"]["sources"]))
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


class Workflow(_Model):
    id: UUID = Field(default_factory=uuid4)
    org_id: str
    name: str
    description: str = ""
    created_by: str
    created_at: datetime = Field(default_factory=utcnow)
    latest_version: int | None = None


class WorkflowVersion(WorkflowVersionSpec):
    """One published version of a workflow: never changed (a change is a new version)."""

    id: UUID = Field(default_factory=uuid4)
    org_id: str
    workflow_id: UUID
    workflow: str
    version: int
    published_by: str
    published_at: datetime = Field(default_factory=utcnow)

    def spec(self) -> WorkflowVersionSpec:
        return WorkflowVersionSpec.model_validate(
            self.model_dump(include=set(WorkflowVersionSpec.model_fields))
        )

    @property
    def label(self) -> str:
        return f"{self.workflow} v{self.version}"

    def allows(self, tool: str, connector: str | None) -> bool:
        """Whether the gate lets a call of ``tool`` through: named in ``tools``, or a tool
        of a connector named in ``connectors``."""
        return tool in self.tools or (connector is not None and connector in self.connectors)

    def needs_approval(self, tool: str, tier: CapabilityTier) -> str | None:
        """Why a call of ``tool`` (of ``tier``) waits for a person here, or ``None``."""
        if tool in self.approval_tools:
            return f"workflow {self.label} gates {tool!r} behind approval"
        if tier in self.approval_tiers:
            return f"workflow {self.label} gates {tier.value} calls behind approval"
        if tier in _IMPLIED_APPROVAL[self.risk]:
            return (
                f"workflow {self.label} is {self.risk.value} risk: {tier.value} calls need approval"
            )
        return None


class WorkflowAcceptance(_Model):
    """One workflow version's shadow runs and how people labelled them (as
    ``ShadowAcceptance`` counts them per agent)."""

    workflow_id: UUID
    workflow: str
    version: int
    runs: int
    labelled: int
    accepted: int
    rejected: int
    mixed: int
    proposals: int
    acceptance_rate: float | None


class EvidenceCheck(_Model):
    """A run's cited evidence against its version's requirement."""

    sources: tuple[str, ...]
    """Distinct source ids the run's executed calls returned, in first-cited order."""
    versions: tuple[str, ...] = ()
    """``source_id@version`` for the cited sources whose results carried a version."""
    required: RequiredEvidence
    missing: tuple[str, ...] = ()
    satisfied: bool

    def finding(self) -> str:
        parts = []
        if len(self.sources) < self.required.min_sources:
            parts.append(
                f"needs at least {self.required.min_sources} cited sources, found "
                f"{len(self.sources)}"
            )
        if self.missing:
            parts.append(f"never cited {', '.join(self.missing)}")
        return "required evidence missing: " + "; ".join(parts)


def check_evidence(
    required: RequiredEvidence, sources: Sequence[str], versions: Sequence[str] = ()
) -> EvidenceCheck:
    seen = tuple(dict.fromkeys(sources))
    missing = tuple(s for s in required.sources if s not in seen)
    return EvidenceCheck(
        sources=seen,
        versions=tuple(dict.fromkeys(versions)),
        required=required,
        missing=missing,
        satisfied=len(seen) >= required.min_sources and not missing,
    )


def evidence_of(rows: Sequence[dict[str, Any]], required: RequiredEvidence) -> EvidenceCheck:
    """A run's evidence from its gate audit rows: the source ids (and versions) of the calls
    that ran (status OK), oldest first."""
    sources: list[str] = []
    versions: list[str] = []
    for row in rows:
        if row.get("status") == "OK":
            sources.extend(row.get("source_ids") or ())
            versions.extend(row.get("source_versions") or ())
    return check_evidence(required, sources, versions)


def check_input_schema(schema: dict[str, Any], limits: InputLimits = _LIMITS) -> None:
    """A version's input schema is a JSON schema (2020-12) of an object, whose patterns are
    short enough and compile (see ``_patterns``).

    Raises:
        InvalidRequestError: Not a valid schema, too large, not of an object, or a pattern
            too long or invalid.
    """
    size = len(json.dumps(schema, default=str).encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidRequestError(f"input_schema: at most {MAX_SCHEMA_BYTES} bytes, got {size}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise InvalidRequestError(
            f"input_schema is not a valid JSON schema: {where}: {exc.message}"
        ) from None
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise InvalidRequestError("input_schema must describe an object (type: object)")
    check_patterns(schema, limits.max_pattern_chars)


def check_inputs(
    version: WorkflowVersion, inputs: Any, limits: InputLimits = _LIMITS
) -> dict[str, Any]:
    """A run's inputs, valid against its version's schema: at most ``limits.max_bytes`` as
    JSON, and checked with the schema's patterns bounded in time (a version published
    before patterns were checked may hold a catastrophic one: see ``_patterns``).

    Raises:
        InvalidRequestError: Not an object, too large, the first failing path and why, or a
            pattern that ran out of the time budget.
    """
    if not isinstance(inputs, dict):
        raise InvalidRequestError("inputs must be a JSON object")
    size = len(json.dumps(inputs, default=str).encode())
    if size > limits.max_bytes:
        raise InvalidRequestError(f"inputs: at most {limits.max_bytes} bytes as JSON, got {size}")
    try:
        with bounded_validator(version.input_schema, limits.pattern_budget_s) as validator:
            errors = sorted(validator.iter_errors(inputs), key=lambda e: list(map(str, e.path)))
    except PatternTimeout as slow:
        raise InvalidRequestError(
            f"inputs cannot be checked against {version.label}'s schema: its pattern "
            f"{slow.pattern[:200]!r} did not finish within {limits.pattern_budget_s} s on these "
            "inputs (a pattern that backtracks catastrophically?): publish a version with a "
            "simpler pattern"
        ) from None
    except Exception as exc:  # an unresolvable $ref, a pattern the regex engine refuses
        raise InvalidRequestError(
            f"inputs cannot be checked against {version.label}'s schema: "
            f"{type(exc).__name__}: {exc}"[:500]
        ) from None
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
        raise InvalidRequestError(f"inputs: {where}: {errors[0].message}"[:1000])
    return inputs


_SAFETY = {RunMode.EXECUTE: 0, RunMode.DRY_RUN: 1, RunMode.SHADOW: 1}


def run_mode_for(version: WorkflowVersion, asked: RunMode | None) -> RunMode:
    """The mode a run of ``version`` takes: its default, or one at least as safe (dry_run
    and shadow are equally safe: neither runs a WRITE or ADMIN call).

    Raises:
        InvalidRequestError: ``execute`` asked of a version whose default is not.
    """
    if asked is None:
        return version.default_mode
    if _SAFETY[asked] < _SAFETY[version.default_mode]:
        raise InvalidRequestError(
            f"workflow {version.label} runs {version.default_mode.value} by default; a run may "
            f"only choose a safer mode (dry_run, shadow), not {asked.value}: publish a version "
            "whose default mode is execute"
        )
    return asked


def version_from_row(row: dict[str, Any]) -> WorkflowVersion:
    """A ``workflow_versions`` row read with ``VERSION_SELECT``."""
    return WorkflowVersion(
        id=row["id"],
        org_id=row["org_id"],
        workflow_id=row["workflow_id"],
        workflow=row["workflow"],
        version=row["version"],
        instructions=row["instructions"],
        input_schema=row["input_schema"],
        tools=tuple(row["tools"] or ()),
        connectors=tuple(row["connectors"] or ()),
        required_evidence=RequiredEvidence.model_validate(row["required_evidence"] or {}),
        risk=RiskLevel(row["risk"]),
        approval_tools=tuple(row["approval_tools"] or ()),
        approval_tiers=tuple(CapabilityTier(t) for t in row["approval_tiers"] or ()),
        default_mode=RunMode(row["default_mode"]),
        published_by=row["published_by"],
        published_at=row["published_at"],
    )


VERSION_SELECT = """
SELECT v.*, w.name AS workflow FROM workflow_versions v
JOIN workflows w ON w.org_id = v.org_id AND w.id = v.workflow_id
"""


class WorkflowStore:
    """Typed reads and writes of ``workflows`` and ``workflow_versions``. Versions are
    cached by id once read: a published version never changes."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._versions: dict[tuple[str, UUID], WorkflowVersion] = {}

    async def create(self, workflow: Workflow) -> Workflow:
        try:
            async with self.db.transaction() as conn:
                await conn.execute(
                    """
                    INSERT INTO workflows (org_id, id, name, description, created_by, created_at)
                    VALUES (%s, %s, %s, %s, %s, %s)
                    """,
                    (
                        workflow.org_id,
                        workflow.id,
                        workflow.name,
                        workflow.description,
                        workflow.created_by,
                        workflow.created_at,
                    ),
                )
        except psycopg.errors.UniqueViolation:
            raise ConflictError(f"workflow {workflow.name!r} already exists here") from None
        return workflow

    async def in_org(self, org_id: str) -> list[Workflow]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT w.*, (SELECT max(version) FROM workflow_versions v
                             WHERE v.org_id = w.org_id AND v.workflow_id = w.id)
                            AS latest_version
                FROM workflows w WHERE w.org_id = %s ORDER BY w.name
                """,
                (org_id,),
            )
            return [Workflow.model_validate(r) for r in await cur.fetchall()]

    async def get(self, org_id: str, name: str) -> Workflow:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT w.*, (SELECT max(version) FROM workflow_versions v
                             WHERE v.org_id = w.org_id AND v.workflow_id = w.id)
                            AS latest_version
                FROM workflows w WHERE w.org_id = %s AND w.name = %s
                """,
                (org_id, name),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no workflow {name!r} in this organisation")
        return Workflow.model_validate(row)

    async def publish(
        self, workflow: Workflow, spec: WorkflowVersionSpec, by: str, version: int | None = None
    ) -> tuple[WorkflowVersion, bool]:
        """Publish ``spec`` as the next version (or as exactly ``version``); returns the
        version and whether it was made now (``False``: ``version`` exists with this very
        spec, so publishing again changes nothing).

        Raises:
            ConflictError: ``version`` exists with another spec (versions are immutable), or
                another version was published at the same moment.
            InvalidRequestError: ``version`` is not the next one.
        """
        if version is not None:
            try:
                found = await self.version(workflow.org_id, workflow.name, version)
            except NotFoundError:
                found = None
            if found is not None:
                if found.spec().canonical() == spec.canonical():
                    return found, False
                raise ConflictError(
                    f"workflow {found.label} is published and immutable: publish a new version"
                )
            following = (workflow.latest_version or 0) + 1
            if version != following:
                raise InvalidRequestError(
                    f"version {version} of {workflow.name!r} cannot be published: the next "
                    f"version is {following}"
                )
        data = spec.model_dump(mode="json")
        made = uuid4()
        try:
            async with self.db.transaction() as conn:
                cur = await conn.execute(
                    """
                    INSERT INTO workflow_versions (org_id, id, workflow_id, version, instructions,
                        input_schema, tools, connectors, required_evidence, risk,
                        approval_tools, approval_tiers, default_mode, published_by)
                    SELECT %s, %s, %s, coalesce(max(version), 0) + 1, %s, %s, %s, %s, %s, %s,
                           %s, %s, %s, %s
                    FROM workflow_versions WHERE org_id = %s AND workflow_id = %s
                    RETURNING version
                    """,
                    (
                        workflow.org_id, made, workflow.id, spec.instructions,
                        Jsonb(spec.input_schema), sorted(set(spec.tools)),
                        sorted(set(spec.connectors)), Jsonb(data["required_evidence"]),
                        spec.risk.value, sorted(set(spec.approval_tools)),
                        sorted({t.value for t in spec.approval_tiers}), spec.default_mode.value,
                        by, workflow.org_id, workflow.id,
                    ),
                )  # fmt: skip
                row = await cur.fetchone()
                assert row is not None
                if version is not None and row["version"] != version:
                    # Rolled back: another publish came first.
                    raise ConflictError(
                        f"version {version} of {workflow.name!r} was published meanwhile"
                    )
        except psycopg.errors.UniqueViolation:
            raise ConflictError(
                f"another version of {workflow.name!r} was published at the same moment; "
                "read it and try again"
            ) from None
        return await self.version_by_id(workflow.org_id, made), True

    async def versions(self, org_id: str, workflow_id: UUID) -> list[WorkflowVersion]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"{VERSION_SELECT} WHERE v.org_id = %s AND v.workflow_id = %s ORDER BY v.version",
                (org_id, workflow_id),
            )
            return [version_from_row(r) for r in await cur.fetchall()]

    async def version(self, org_id: str, name: str, version: int | None = None) -> WorkflowVersion:
        """A workflow's version by number, or its latest.

        Raises:
            NotFoundError: No such workflow or version here (or none published yet).
        """
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"""{VERSION_SELECT}
                WHERE v.org_id = %s AND w.name = %s AND (%s::int IS NULL OR v.version = %s)
                ORDER BY v.version DESC LIMIT 1
                """,
                (org_id, name, version, version),
            )
            row = await cur.fetchone()
        if row is None:
            if version is None:
                raise NotFoundError(f"workflow {name!r} has no published version here")
            raise NotFoundError(f"workflow {name!r} has no version {version} here")
        found = version_from_row(row)
        self._versions[(org_id, found.id)] = found
        return found

    async def version_by_id(self, org_id: str, version_id: UUID) -> WorkflowVersion:
        cached = self._versions.get((org_id, version_id))
        if cached is not None:
            return cached
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"{VERSION_SELECT} WHERE v.org_id = %s AND v.id = %s", (org_id, version_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no workflow version {version_id} in this organisation")
        found = version_from_row(row)
        self._versions[(org_id, version_id)] = found
        return found

    async def acceptance(self, org_id: str, workflow_id: UUID | None) -> list[WorkflowAcceptance]:
        """Per workflow version: its shadow runs, their labels, the proposals they made."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT w.id AS workflow_id, w.name AS workflow, v.version, count(*) AS runs,
                       count(l.run_id) AS labelled,
                       count(*) FILTER (WHERE l.label = 'accepted') AS accepted,
                       count(*) FILTER (WHERE l.label = 'rejected') AS rejected,
                       count(*) FILTER (WHERE l.label = 'mixed') AS mixed,
                       coalesce(sum((SELECT count(*) FROM audit_log x
                                     WHERE x.org_id = r.org_id AND x.run_id = r.id
                                       AND x.decision = 'proposed')), 0) AS proposals
                FROM task_runs r
                JOIN workflow_versions v
                  ON v.org_id = r.org_id AND v.id = r.workflow_version_id
                JOIN workflows w ON w.org_id = v.org_id AND w.id = v.workflow_id
                LEFT JOIN run_labels l ON l.org_id = r.org_id AND l.run_id = r.id
                WHERE r.org_id = %s AND r.run_mode = 'shadow'
                  AND (%s::uuid IS NULL OR w.id = %s)
                GROUP BY w.id, w.name, v.version
                ORDER BY w.name, v.version
                """,
                (org_id, workflow_id, workflow_id),
            )
            rows = await cur.fetchall()
        return [
            WorkflowAcceptance(
                **{k: r[k] for k in ("workflow_id", "workflow", "version", "runs", "labelled")},
                accepted=r["accepted"],
                rejected=r["rejected"],
                mixed=r["mixed"],
                proposals=int(r["proposals"]),
                acceptance_rate=(r["accepted"] / r["labelled"]) if r["labelled"] else None,
            )
            for r in rows
        ]

    async def runs(self, org_id: str, workflow_id: UUID, limit: int = 50) -> list[dict[str, Any]]:
        """The workflow's runs, newest first: id, version, mode, status, times."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT r.id, v.version, r.agent_id, r.run_mode, r.status, r.requested_by,
                       r.created_at, r.finished_at, r.reason
                FROM task_runs r
                JOIN workflow_versions v
                  ON v.org_id = r.org_id AND v.id = r.workflow_version_id
                WHERE r.org_id = %s AND v.workflow_id = %s
                ORDER BY r.created_at DESC LIMIT %s
                """,
                (org_id, workflow_id, limit),
            )
            return list(await cur.fetchall())
