"""The source health monitor: freshness policies, persisted health reports with typed
findings, and the warnings retrieval attaches to hits and facts from unhealthy sources.

A check looks at every source of a collection and records, per source, zero or more
findings, each with the source's latest version (the published one, else the newest
registered):

- ``UNKNOWN_FRESHNESS``: no freshness policy covers the source (not a warning);
- ``STALE``: the source was last read successfully longer ago than its policy's expected
  interval; ``EXPIRED``: longer than ``expires_after_s`` (default four intervals);
- ``DEGRADED``: its last read failed (or it was skipped) and an older version is served;
- ``PERMISSION_DENIED``: its last read failed for lack of permission;
- ``DOWN``: it disappeared from the source listing.

"Last read successfully" is the last ``READ_OK`` health event (an unchanged re-read counts:
the content is confirmed current), else the version's registration time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray.storage import Conn, Database

__all__ = [
    "WARNING_KINDS",
    "FindingKind",
    "HealthFinding",
    "HealthSweeper",
    "SourceHealthMonitor",
    "SourceHealthReport",
]

FindingKind = Literal[
    "STALE", "EXPIRED", "DEGRADED", "DOWN", "PERMISSION_DENIED", "UNKNOWN_FRESHNESS"
]
WARNING_KINDS: frozenset[str] = frozenset(
    {"STALE", "EXPIRED", "DEGRADED", "DOWN", "PERMISSION_DENIED"}
)
"""The findings that make a source unhealthy: its hits and facts carry a warning."""

log = logging.getLogger("cortex_ray.knowledge.health")

EXPIRY_INTERVALS = 4.0
"""A source expires after this many expected intervals unless its policy says otherwise."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class HealthFinding(_Frozen):
    source_id: UUID
    path: str
    kind: FindingKind
    latest_version: int | None
    detail: str


class SourceHealthReport(_Frozen):
    id: int
    collection: str
    checked_at: datetime
    sources: int
    findings: list[HealthFinding]


_SOURCES = """
SELECT s.id, s.path, s.health, s.health_detail, s.health_at,
       (SELECT max(e.at) FROM kb_source_events e
        WHERE e.org_id = s.org_id AND e.source_id = s.id AND e.event = 'READ_OK') AS last_ok,
       pub.version AS published_version,
       (SELECT max(v.version) FROM kb_source_versions v
        WHERE v.org_id = s.org_id AND v.source_id = s.id
          AND strpos(v.content_hash, ':failed:') = 0) AS newest_version,
       (SELECT v.created_at FROM kb_source_versions v
        WHERE v.org_id = s.org_id AND v.source_id = s.id
          AND v.version = coalesce(pub.version, s.next_version - 1)) AS version_at,
       coalesce(ps.expected_interval_s, pc.expected_interval_s) AS interval_s,
       coalesce(ps.expires_after_s, pc.expires_after_s) AS expires_s
FROM kb_sources s
JOIN kb_collections c ON c.org_id = s.org_id AND c.name = s.collection
LEFT JOIN kb_generation_sources pub
  ON pub.org_id = s.org_id AND pub.generation = c.published_generation AND pub.source_id = s.id
LEFT JOIN kb_freshness_policies ps
  ON ps.org_id = s.org_id AND ps.collection = s.collection AND ps.source_id = s.id
LEFT JOIN kb_freshness_policies pc
  ON pc.org_id = s.org_id AND pc.collection = s.collection AND pc.source_id IS NULL
WHERE s.org_id = %s AND s.collection = %s
ORDER BY s.path
"""


class SourceHealthMonitor:
    """Freshness policies, checks and reports of one database's sources."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def set_policy(
        self,
        org_id: str,
        collection: str,
        expected_interval_s: float,
        *,
        expires_after_s: float | None = None,
        path: str | None = None,
    ) -> None:
        """A collection's freshness policy, or (``path``) one source's, which wins."""
        if not expected_interval_s > 0:
            raise InvalidRequestError("expected_interval_s must be positive")
        if expires_after_s is not None and expires_after_s < expected_interval_s:
            raise InvalidRequestError("expires_after_s must be at least expected_interval_s")
        async with self.db.transaction() as conn:
            await _collection(conn, org_id, collection)
            source_id = None
            if path is not None:
                row = await (
                    await conn.execute(
                        "SELECT id FROM kb_sources WHERE org_id = %s AND collection = %s "
                        "AND path = %s",
                        (org_id, collection, path),
                    )
                ).fetchone()
                if row is None:
                    raise NotFoundError(f"no source {path!r} in collection {collection!r}")
                source_id = row["id"]
            await conn.execute(
                """
                INSERT INTO kb_freshness_policies
                    (org_id, collection, source_id, expected_interval_s, expires_after_s)
                VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (org_id, collection, source_id) DO UPDATE
                SET expected_interval_s = EXCLUDED.expected_interval_s,
                    expires_after_s = EXCLUDED.expires_after_s, updated_at = now()
                """,
                (org_id, collection, source_id, expected_interval_s, expires_after_s),
            )

    async def check(
        self, org_id: str, collection: str, *, now: datetime | None = None
    ) -> SourceHealthReport:
        """Check every source of ``collection`` and persist the report."""
        now = now or datetime.now(UTC)
        async with self.db.transaction() as conn:
            await _collection(conn, org_id, collection)
            sources = await (await conn.execute(_SOURCES, (org_id, collection))).fetchall()
            findings = [f for s in sources for f in _findings(s, now)]
            report = await (
                await conn.execute(
                    "INSERT INTO kb_health_reports (org_id, collection, checked_at, sources, "
                    "findings) VALUES (%s, %s, %s, %s, %s) RETURNING id, checked_at",
                    (org_id, collection, now, len(sources), len(findings)),
                )
            ).fetchone()
            assert report is not None
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO kb_health_findings (org_id, report_id, source_id, kind, "
                    "latest_version, detail) VALUES (%s, %s, %s, %s, %s, %s)",
                    [
                        (org_id, report["id"], f.source_id, f.kind, f.latest_version, f.detail)
                        for f in findings
                    ],
                )
        return SourceHealthReport(
            id=report["id"],
            collection=collection,
            checked_at=report["checked_at"],
            sources=len(sources),
            findings=findings,
        )

    async def check_due(
        self, interval_s: float, *, now: datetime | None = None
    ) -> list[SourceHealthReport]:
        """Check every collection (of every organisation) that has a freshness policy and
        no report younger than ``interval_s``; the reports, oldest check first.

        Two sweepers racing may both check a collection: one extra report, nothing lost.
        """
        now = now or datetime.now(UTC)
        async with self.db.connection() as conn:
            due = await (
                await conn.execute(
                    """
                    SELECT p.org_id, p.collection, max(r.checked_at) AS last
                    FROM (SELECT DISTINCT org_id, collection FROM kb_freshness_policies) p
                    LEFT JOIN kb_health_reports r
                      ON r.org_id = p.org_id AND r.collection = p.collection
                    GROUP BY p.org_id, p.collection
                    HAVING max(r.checked_at) IS NULL
                        OR max(r.checked_at) <= %s - make_interval(secs => %s)
                    ORDER BY max(r.checked_at) NULLS FIRST, p.org_id, p.collection
                    """,
                    (now, interval_s),
                )
            ).fetchall()
        reports = []
        for row in due:
            try:
                reports.append(await self.check(row["org_id"], row["collection"], now=now))
            except NotFoundError:  # the collection went away meanwhile
                continue
        return reports

    async def prune(
        self, retention_s: float, *, now: datetime | None = None, batch: int = 1000
    ) -> int:
        """Delete the reports (of every organisation) checked more than ``retention_s`` ago,
        except each collection's latest, with their findings; how many reports went.

        Every read of the reports (``latest``, the ``kb_source_findings`` view behind the
        warnings, ``check_due``'s last check) looks only at a collection's latest report,
        which is never deleted however old, so what agents and callers are told is
        unchanged. Deletes ``batch`` reports a transaction, so that a first prune of a long
        history holds no long lock.
        """
        now = now or datetime.now(UTC)
        deleted = 0
        while True:
            async with self.db.transaction() as conn:
                cur = await conn.execute(
                    """
                    DELETE FROM kb_health_reports d
                    USING (
                        SELECT r.org_id, r.id FROM kb_health_reports r
                        WHERE r.checked_at < %s - make_interval(secs => %s)
                          AND r.id < (SELECT max(l.id) FROM kb_health_reports l
                                      WHERE l.org_id = r.org_id
                                        AND l.collection = r.collection)
                        LIMIT %s
                    ) old
                    WHERE d.org_id = old.org_id AND d.id = old.id
                    """,
                    (now, retention_s, batch),
                )
                gone = cur.rowcount
            deleted += gone
            if gone < batch:
                return deleted

    async def latest(self, org_id: str, collection: str) -> SourceHealthReport | None:
        """The collection's latest report, or ``None`` before its first check."""
        async with self.db.connection() as conn:
            await _collection(conn, org_id, collection)
            report = await (
                await conn.execute(
                    "SELECT id, checked_at, sources FROM kb_health_reports "
                    "WHERE org_id = %s AND collection = %s ORDER BY id DESC LIMIT 1",
                    (org_id, collection),
                )
            ).fetchone()
            if report is None:
                return None
            rows = await (
                await conn.execute(
                    "SELECT f.*, s.path FROM kb_health_findings f JOIN kb_sources s "
                    "ON s.org_id = f.org_id AND s.id = f.source_id "
                    "WHERE f.org_id = %s AND f.report_id = %s ORDER BY s.path, f.kind",
                    (org_id, report["id"]),
                )
            ).fetchall()
        return SourceHealthReport(
            id=report["id"],
            collection=collection,
            checked_at=report["checked_at"],
            sources=report["sources"],
            findings=[
                HealthFinding(
                    source_id=r["source_id"],
                    path=r["path"],
                    kind=r["kind"],
                    latest_version=r["latest_version"],
                    detail=r["detail"],
                )
                for r in rows
            ],
        )


class HealthSweeper:
    """Runs the monitor's due checks every ``interval_s`` in the background, where the API
    runs (``serve.create_app`` starts one when ``knowledge.health_check_interval_s`` is set).

    It wakes every ``min(interval_s, 60)`` seconds, so a new freshness policy is checked
    within a minute, and a collection is checked again once its last report is
    ``interval_s`` old (however many processes sweep). With ``retention_days`` it also
    deletes the reports older than that, keeping each collection's latest (``prune``).
    """

    def __init__(
        self,
        monitor: SourceHealthMonitor,
        interval_s: float,
        *,
        retention_days: float | None = None,
    ) -> None:
        self.monitor = monitor
        self.interval_s = interval_s
        self.retention_days = retention_days
        self._task: asyncio.Task[None] | None = None
        self._pruned_at: datetime | None = None

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="source health sweeper")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sweep(self, *, now: datetime | None = None) -> list[SourceHealthReport]:
        """One pass: check the collections that are due, then (at most once an hour) delete
        the reports older than ``retention_days`` but each collection's latest; the new
        reports."""
        now = now or datetime.now(UTC)
        reports = await self.monitor.check_due(self.interval_s, now=now)
        for r in reports:
            unhealthy = sum(1 for f in r.findings if f.kind in WARNING_KINDS)
            if unhealthy:
                log.warning("collection %s: %d unhealthy findings", r.collection, unhealthy)
        # Hourly: the retention is days long, and the old reports are found by a scan
        # of the reports' table (no index on checked_at), which every minute would waste.
        if self.retention_days is not None and (
            self._pruned_at is None or now - self._pruned_at >= timedelta(hours=1)
        ):
            self._pruned_at = now
            gone = await self.monitor.prune(self.retention_days * 86400, now=now)
            if gone:
                log.info("deleted %d source health reports past their retention", gone)
        return reports

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # the database away for a moment: the next pass
                log.warning("the source health sweep failed: %s", exc)
            await asyncio.sleep(min(self.interval_s, 60.0))


async def _collection(conn: Conn, org_id: str, collection: str) -> None:
    row = await (
        await conn.execute(
            "SELECT 1 FROM kb_collections WHERE org_id = %s AND name = %s", (org_id, collection)
        )
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no collection {collection!r}")


def _findings(s: dict[str, Any], now: datetime) -> list[HealthFinding]:
    version = s["published_version"] or s["newest_version"]

    def finding(kind: FindingKind, detail: str) -> HealthFinding:
        return HealthFinding(
            source_id=s["id"], path=s["path"], kind=kind, latest_version=version, detail=detail
        )

    out: list[HealthFinding] = []
    health, detail = s["health"], s["health_detail"] or ""
    if health == "DISAPPEARED":
        out.append(finding("DOWN", f"gone from the listing since {s['health_at']:%Y-%m-%d %H:%M}"))
    elif health == "READ_FAILURE" and ("ermission denied" in detail or "Errno 13" in detail):
        out.append(finding("PERMISSION_DENIED", detail[:500]))
    elif health in ("READ_FAILURE", "SKIPPED"):
        served = f"; version v{s['published_version']} served" if s["published_version"] else ""
        out.append(finding("DEGRADED", f"{health.lower()}: {detail[:400]}{served}"))
    if s["interval_s"] is None:
        out.append(finding("UNKNOWN_FRESHNESS", "no freshness policy"))
        return out
    seen = s["last_ok"] or s["version_at"]
    if seen is None:
        return out
    age = (now - seen).total_seconds()
    expires = s["expires_s"] or EXPIRY_INTERVALS * s["interval_s"]
    if age > expires:
        out.append(
            finding("EXPIRED", f"last read {_span(age)} ago; expires after {_span(expires)}")
        )
    elif age > s["interval_s"]:
        out.append(
            finding("STALE", f"last read {_span(age)} ago; expected every {_span(s['interval_s'])}")
        )
    return out


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
