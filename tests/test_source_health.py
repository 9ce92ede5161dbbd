"""The source health monitor: freshness policies, persisted reports with typed findings and
the latest version per finding, and the warning that hits and graph facts from unhealthy
sources carry to the agent's observation and the API response."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from knowledge_fixtures import ingest

from cortex_ray import AccessDeniedError, AgentMode, Grant, NotFoundError, Principal
from cortex_ray._types import ObservationStatus
from cortex_ray.act import InvocationContext
from cortex_ray.graph import GraphWriter
from cortex_ray.graph._writer import assert_rows
from cortex_ray.knowledge import KnowledgeWriter, SourceHealthMonitor
from cortex_ray.storage import Database

FILES = {
    "fresh.md": b"# Fresh\n\nThe zebra manual is current.\n",
    "hourly.md": b"# Hourly\n\nThe zebra feed changes hourly.\n",
    "locked.md": b"# Locked\n\nThe zebra vault.\n",
    "gone.md": b"# Gone\n\nThe zebra archive, contact arch@example.com.\n",
    "flaky.md": b"# Flaky\n\nThe zebra mirror.\n",
}


def publish(dsn: str, org: str) -> dict[str, Any]:
    with KnowledgeWriter(dsn) as writer:
        run = ingest(writer, org, "docs", FILES)
        writer.record_health_events(
            org,
            "docs",
            [
                ("locked.md", "READ_FAILURE", "unreadable: [Errno 13] Permission denied"),
                ("gone.md", "DISAPPEARED", ""),
                ("flaky.md", "READ_FAILURE", "changed while being read"),
            ],
        )
        gone = run.sources["gone.md"]
    with GraphWriter(dsn) as gw:
        graph_run = gw.begin_run(org)
        data = FILES["gone.md"]
        start = data.index(b"arch@example.com")
        with gw.conn.transaction():
            assert_rows(gw.conn, org, graph_run, [{
                "s_type": "document", "s_name": "gone.md", "p": "mentions",
                "o_type": "email", "o_name": "arch@example.com",
                "source_id": str(gone.source_id), "source_version": gone.version,
                "method": "deterministic", "method_version": "rules-1",
                "byte_start": start, "byte_end": start + 16, "line_start": 3, "line_end": 3,
            }])  # fmt: skip
    return run.sources


async def test_findings_are_typed_persisted_and_carry_the_latest_version(
    db: Database, org: str
) -> None:
    sources = await asyncio.to_thread(publish, db.dsn, org)
    monitor = SourceHealthMonitor(db)
    first = await monitor.check(org, "docs")
    assert {(f.path, f.kind) for f in first.findings} == {
        (path, "UNKNOWN_FRESHNESS") for path in FILES
    } | {("locked.md", "PERMISSION_DENIED"), ("gone.md", "DOWN"), ("flaky.md", "DEGRADED")}

    await monitor.set_policy(org, "docs", 86400)
    await monitor.set_policy(org, "docs", 3600, path="hourly.md")
    later = datetime.now(UTC) + timedelta(hours=2)
    report = await monitor.check(org, "docs", now=later)
    kinds = {(f.path, f.kind) for f in report.findings}
    assert kinds == {
        ("hourly.md", "STALE"),  # read 2 h ago, expected hourly
        ("locked.md", "PERMISSION_DENIED"),
        ("gone.md", "DOWN"),
        ("flaky.md", "DEGRADED"),
    }
    assert all(f.latest_version == sources[f.path].version for f in report.findings)
    much_later = await monitor.check(org, "docs", now=datetime.now(UTC) + timedelta(days=5))
    assert ("fresh.md", "EXPIRED") in {(f.path, f.kind) for f in much_later.findings}
    assert ("hourly.md", "EXPIRED") in {(f.path, f.kind) for f in much_later.findings}

    stored = await monitor.latest(org, "docs")
    assert stored is not None and stored.id == much_later.id
    assert {(f.path, f.kind) for f in stored.findings} == {
        (f.path, f.kind) for f in much_later.findings
    }
    with pytest.raises(NotFoundError):
        await monitor.check(org, "nope")
    with pytest.raises(NotFoundError):
        await monitor.set_policy(org, "docs", 60, path="missing.md")


async def test_warnings_reach_hits_facts_and_the_agents_observation(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    runtime = await scripted_runtime(None)
    await asyncio.to_thread(publish, db.dsn, org)
    assert await runtime.source_health(org, "docs") is None
    await runtime.set_freshness_policy(org, "docs", 86400)
    report = await runtime.check_source_health(org, "docs")
    assert {f.kind for f in report.findings} == {"PERMISSION_DENIED", "DOWN", "DEGRADED"}

    found = await runtime.search_knowledge(org, "zebra", k=10)
    warned = {h.path: h.warning for h in found.hits}
    assert warned["fresh.md"] is None
    assert warned["locked.md"] == (
        "source locked.md is PERMISSION_DENIED (latest version v1): this may be out of date"
    )
    facts = await runtime.search_graph(org, terms=["arch@example.com"])
    assert [f.findings for f in facts.facts] == [("DOWN",)]
    assert facts.warnings == ["source gone.md is DOWN (latest version v1): this may be out of date"]

    agent = await runtime.create_agent(
        org,
        "reader",
        mode=AgentMode.AUTONOMOUS,
        tools=["knowledge_search", "graph_search"],
        grant=Grant(tools=frozenset({"knowledge_search", "graph_search"})),
    )
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
    obs = await runtime.dispatcher.invoke(ctx, "knowledge_search", {"query": "zebra vault"})
    assert obs.status is ObservationStatus.OK
    top = {h["path"]: h for h in obs.output["hits"]}
    assert "PERMISSION_DENIED" in top["locked.md"]["warning"]
    graph = await runtime.dispatcher.invoke(ctx, "graph_search", {"query": "arch@example.com"})
    assert "DOWN" in graph.output["facts"][0]["warning"]
    assert graph.output["warnings"] == facts.warnings

    member = Principal(id="m", org_id=org, grant=Grant(tools=frozenset({"knowledge_search"})))
    with pytest.raises(AccessDeniedError):
        await runtime.check_source_health(org, "docs", principal=member)
    with pytest.raises(AccessDeniedError):
        await runtime.set_freshness_policy(org, "docs", 60, principal=member)
    assert await runtime.source_health(org, "docs", principal=member) is not None


async def test_the_health_routes(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    httpx2 = pytest.importorskip("httpx2")
    from serve import create_app

    runtime = await scripted_runtime(None)
    await runtime.store.ensure_org(org)
    await asyncio.to_thread(publish, db.dsn, org)
    admin = Principal(id="ada", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    user = Principal(id="bo", org_id=org, grant=Grant(tools=frozenset({"knowledge_search"})))
    keys = {p.id: (await runtime.store.create_api_key(p, p.id))[0] for p in (admin, user)}
    base = f"/api/orgs/{org}/knowledge"
    transport = httpx2.ASGITransport(app=create_app(runtime))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:

        def auth(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {keys[who]}"}

        r = await client.get(f"{base}/collections/docs/health", headers=auth("bo"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await client.put(
            f"{base}/collections/docs/freshness", headers=auth("ada"),
            json={"expectedIntervalS": 86400, "expiresAfterS": 3600},
        )  # fmt: skip
        assert r.status_code == 422  # expires before it is stale: refused
        r = await client.put(
            f"{base}/collections/docs/freshness",
            headers=auth("ada"),
            json={"expectedIntervalS": 86400},
        )
        assert r.status_code == 204, r.text
        r = await client.post(f"{base}/collections/docs/health", headers=auth("bo"))
        assert r.status_code == 403
        r = await client.post(f"{base}/collections/docs/health", headers=auth("ada"))
        assert r.status_code == 201, r.text
        kinds = {(f["path"], f["kind"]) for f in r.json()["findings"]}
        assert ("gone.md", "DOWN") in kinds and r.json()["sources"] == 5
        r = await client.get(f"{base}/collections/docs/health", headers=auth("bo"))
        assert r.status_code == 200 and r.json()["findings"][0]["latestVersion"] == 1
        r = await client.get(f"{base}/search", headers=auth("bo"), params={"query": "vault"})
        hit = next(h for h in r.json()["hits"] if h["path"] == "locked.md")
        assert "PERMISSION_DENIED" in hit["warning"]
        r = await client.put(
            f"{base}/collections/docs/freshness", headers=auth("ada"),
            json={"expectedIntervalS": -1},
        )  # fmt: skip
        assert r.status_code == 422


async def test_the_scheduled_sweep_checks_collections_with_a_policy_when_due(
    db: Database, org: str
) -> None:
    """``HealthSweeper`` (started where the API runs) checks each collection that has a
    freshness policy once its last report is an interval old; others never."""
    from cortex_ray.knowledge import HealthSweeper

    await asyncio.to_thread(publish, db.dsn, org)
    with KnowledgeWriter(db.dsn) as writer:
        ingest(writer, org, "unwatched", {"a.md": b"# A\n\nNo policy here.\n"})
    monitor = SourceHealthMonitor(db)
    await monitor.set_policy(org, "docs", 3600)
    sweeper = HealthSweeper(monitor, interval_s=600)
    t0 = datetime.now(UTC)

    first = await sweeper.sweep(now=t0)
    latest = await monitor.latest(org, "docs")
    assert latest is not None and latest.id in {r.id for r in first}
    assert {f.kind for f in latest.findings if f.path == "gone.md"} == {"DOWN"}
    assert await monitor.latest(org, "unwatched") is None

    await sweeper.sweep(now=t0 + timedelta(seconds=60))  # not due yet
    assert (await monitor.latest(org, "docs")).id == latest.id  # type: ignore[union-attr]

    later = await sweeper.sweep(now=t0 + timedelta(seconds=601))
    again = await monitor.latest(org, "docs")
    assert again is not None and again.id != latest.id and again.id in {r.id for r in later}
    assert await monitor.latest(org, "unwatched") is None


async def test_the_sweep_deletes_reports_past_their_retention_but_each_latest(
    scripted_runtime: Callable[..., Any], db: Database, org: str
) -> None:
    """Retention (``knowledge.health_report_retention_days``): reports older than it go with
    their findings, each collection's latest stays however old, and the warnings hits and
    facts carry (read from the latest report) are the same before and after."""
    from cortex_ray.knowledge import HealthSweeper

    runtime = await scripted_runtime(None)
    await asyncio.to_thread(publish, db.dsn, org)
    with KnowledgeWriter(db.dsn) as writer:
        ingest(writer, org, "solo", {"a.md": b"# A\n\nChecked once, long ago.\n"})
    monitor = SourceHealthMonitor(db)
    await monitor.set_policy(org, "docs", 86400)
    now = datetime.now(UTC)
    old = [await monitor.check(org, "docs", now=now - timedelta(days=d)) for d in (60, 40)]
    recent = await monitor.check(org, "docs", now=now - timedelta(days=5))
    latest = await monitor.check(org, "docs", now=now)
    solo = await monitor.check(org, "solo", now=now - timedelta(days=90))

    async def warnings() -> tuple[dict[str, str | None], list[str]]:
        hits = await runtime.search_knowledge(org, "zebra", k=10)
        facts = await runtime.search_graph(org, terms=["arch@example.com"])
        return {h.path: h.warning for h in hits.hits}, facts.warnings

    before = await warnings()
    assert before[1] and before[0]["locked.md"] is not None

    # An interval no collection is due in: this sweep only prunes.
    sweeper = HealthSweeper(monitor, interval_s=1e9, retention_days=30)
    assert await sweeper.sweep(now=now) == []
    async with db.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT collection, id FROM kb_health_reports WHERE org_id = %s", (org,)
            )
        ).fetchall()
        orphans = await (
            await conn.execute(
                "SELECT count(*) AS n FROM kb_health_findings WHERE org_id = %s "
                "AND report_id = ANY(%s)",
                (org, [r.id for r in old]),
            )
        ).fetchone()
    assert {(r["collection"], r["id"]) for r in rows} == {
        ("docs", recent.id),
        ("docs", latest.id),
        ("solo", solo.id),  # 90 days old, but the collection's latest
    }
    assert orphans is not None and orphans["n"] == 0
    assert (await monitor.latest(org, "docs")) == latest
    assert (await monitor.latest(org, "solo")) == solo
    assert await warnings() == before
