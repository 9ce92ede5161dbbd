"""The evaluation tables: versioned suites, suite runs and their per-case results."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Json, Jsonb

from cortex_ray._exceptions import ConflictError, NotFoundError
from cortex_ray.evals._types import (
    CaseResult,
    EvalCase,
    EvalMode,
    EvalRun,
    EvalRunSummary,
    EvalSuite,
    EvalSuiteSummary,
    SuiteMetrics,
)
from cortex_ray.storage import Database

__all__ = ["EvalStore", "cases_digest"]


def cases_digest(cases: tuple[EvalCase, ...]) -> str:
    """sha256 of the cases as canonical JSON: two saves of the same cases are one version."""
    body = [c.model_dump(mode="json") for c in cases]
    raw = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def _suite(row: dict[str, Any]) -> EvalSuite:
    return EvalSuite(
        name=row["name"],
        version=row["version"],
        description=row["description"],
        cases=tuple(EvalCase.model_validate(c) for c in row["cases"]),
        digest=row["digest"],
        created_at=row["created_at"],
        created_by=row["created_by"],
    )


def _summary(row: dict[str, Any]) -> EvalRunSummary:
    return EvalRunSummary(
        id=row["id"],
        org_id=row["org_id"],
        suite=row["suite"],
        suite_version=row["suite_version"],
        mode=EvalMode(row["mode"]),
        model=row["model"],
        overrides=row["overrides"],
        passed=row["passed"],
        total=row["total"],
        metrics=SuiteMetrics.model_validate(row["metrics"]),
        created_by=row["created_by"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


class EvalStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def save_suite(self, org_id: str, suite: EvalSuite, created_by: str | None) -> EvalSuite:
        """Save ``suite``'s cases as its next version (1 for a new name) and return it. The
        same cases as the latest version are that version: nothing new is written."""
        digest = cases_digest(suite.cases)
        # json, not jsonb: a cassette keeps its keys' order (see migration 0008).
        body = Json([c.model_dump(mode="json") for c in suite.cases])
        for _ in range(3):  # two savers racing for one version number: the loser retries
            try:
                async with self.db.transaction() as conn:
                    cur = await conn.execute(
                        "SELECT * FROM eval_suites WHERE org_id = %s AND name = %s "
                        "ORDER BY version DESC LIMIT 1",
                        (org_id, suite.name),
                    )
                    latest = await cur.fetchone()
                    if latest is not None and latest["digest"] == digest:
                        return _suite(latest)
                    version = 1 if latest is None else latest["version"] + 1
                    cur = await conn.execute(
                        """
                        INSERT INTO eval_suites (org_id, name, version, description, cases,
                                                 digest, created_by)
                        VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *
                        """,
                        (
                            org_id,
                            suite.name,
                            version,
                            suite.description,
                            body,
                            digest,
                            created_by,
                        ),
                    )
                    row = await cur.fetchone()
                    assert row is not None
                    return _suite(row)
            except psycopg.errors.UniqueViolation:
                continue
            except psycopg.errors.ForeignKeyViolation as exc:
                raise NotFoundError(f"organisation {org_id!r} not found") from exc
        raise ConflictError(f"suite {suite.name!r}: another save took each version number")

    async def get_suite(self, org_id: str, name: str, version: int | None = None) -> EvalSuite:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM eval_suites WHERE org_id = %s AND name = %s "
                "AND (%s::integer IS NULL OR version = %s) ORDER BY version DESC LIMIT 1",
                (org_id, name, version, version),
            )
            row = await cur.fetchone()
        if row is None:
            which = f" version {version}" if version is not None else ""
            raise NotFoundError(f"eval suite {name!r}{which} not found in organisation {org_id!r}")
        return _suite(row)

    async def list_suites(self, org_id: str) -> list[EvalSuiteSummary]:
        """Each suite's latest version, by name."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT DISTINCT ON (name) name, version, description,
                       json_array_length(cases) AS cases, digest, created_at, created_by
                FROM eval_suites WHERE org_id = %s ORDER BY name, version DESC
                """,
                (org_id,),
            )
            return [EvalSuiteSummary.model_validate(r) for r in await cur.fetchall()]

    async def save_run(self, org_id: str, run: EvalRun) -> None:
        """A suite run and its per-case results, in one transaction."""
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO eval_runs (org_id, id, suite, suite_version, mode, model, overrides,
                                       passed, total, metrics, created_by, started_at,
                                       finished_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (
                    org_id,
                    run.id,
                    run.suite,
                    run.suite_version,
                    run.mode.value,
                    run.model,
                    Jsonb(run.overrides),
                    run.passed,
                    run.total,
                    Jsonb(run.metrics.model_dump(mode="json")),
                    run.created_by,
                    run.started_at,
                    run.finished_at,
                ),
            )
            async with conn.cursor() as cur:
                await cur.executemany(
                    """
                    INSERT INTO eval_results (org_id, eval_run_id, ordinal, case_name, passed,
                                              result)
                    VALUES (%s, %s, %s, %s, %s, %s)
                    """,
                    [
                        (org_id, run.id, i, r.case, r.passed, Json(r.model_dump(mode="json")))
                        for i, r in enumerate(run.results)
                    ],
                )

    async def get_run(self, org_id: str, run_id: UUID) -> EvalRun:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM eval_runs WHERE org_id = %s AND id = %s", (org_id, run_id)
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"eval run {run_id} not found in organisation {org_id!r}")
            cur = await conn.execute(
                "SELECT result FROM eval_results WHERE org_id = %s AND eval_run_id = %s "
                "ORDER BY ordinal",
                (org_id, run_id),
            )
            results = tuple(CaseResult.model_validate(r["result"]) for r in await cur.fetchall())
        summary = _summary(row)
        return EvalRun(**summary.model_dump(), results=results)

    async def list_runs(
        self, org_id: str, suite: str | None = None, limit: int = 50
    ) -> list[EvalRunSummary]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM eval_runs
                WHERE org_id = %s AND (%s::text IS NULL OR suite = %s)
                ORDER BY started_at DESC LIMIT %s
                """,
                (org_id, suite, suite, limit),
            )
            return [_summary(r) for r in await cur.fetchall()]
