"""The deterministic extractor, alone and as a stage of the Ray Data ingestion job: every
fact's evidence reads back to the exact bytes of the version it cites, extraction runs are
recorded, and a new version of a source closes what the old one asserted (never deleting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from cortex_ray.graph import GraphStore, Reader, extract_mentions, facts_from_mentions
from cortex_ray.storage import Database

DOC = """# Runbook ☃

Page ops@example.com, read https://wiki.example.com/runbooks/db. (OPS-1234)
The job writes src/jobs/nightly.py output on 2026-03-01; not 2026-02-30.

Tables
======

    INSERT INTO billing.invoices SELECT * FROM public.orders;

```
# not a heading: ops-two@example.com
```
See acme/infra#77 and docs/setup.md.
"""


def test_every_mention_reads_back_to_its_exact_bytes() -> None:
    data = DOC.encode()
    found = list(extract_mentions(data.splitlines(keepends=True)))
    by_type: dict[str, list[str]] = {}
    for _, m in found:
        assert data[m.byte_start : m.byte_end].decode() == m.name
        line = data.splitlines(keepends=True)[m.line - 1]
        assert m.name.encode() in line
        by_type.setdefault(m.type, []).append(m.name)
    assert by_type == {
        "heading": ["Runbook ☃", "Tables"],
        "url": ["https://wiki.example.com/runbooks/db"],
        "email": ["ops@example.com", "ops-two@example.com"],
        "issue": ["OPS-1234", "acme/infra#77"],
        "path": ["src/jobs/nightly.py", "docs/setup.md"],
        "date": ["2026-03-01"],  # 2026-02-30 is no date
        "table": ["billing.invoices", "public.orders"],
    }
    facts = list(facts_from_mentions("ops/runbook.md", found))
    assert ("document", "ops/runbook.md", "has_heading", "Tables") in {
        (a, b, c, m.name) for a, b, c, m in facts
    }
    # The heading a mention falls under is its section's.
    under = {(b, m.name) for a, b, c, m in facts if a == "heading"}
    assert ("Tables", "billing.invoices") in under and ("Runbook ☃", "OPS-1234") in under


def _rows(dsn: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.integration
async def test_the_ingestion_job_extracts_facts_whose_evidence_is_exact(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    from jobs.ingest import run_ingest

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "runbook.md").write_text(DOC)
    (corpus / "notes.txt").write_text("Contact lead@example.com.\n")
    report = run_ingest(org, "ops", [corpus], dsn=db.dsn, embed=False, graph=True)
    assert report.graph is not None
    assert report.graph["files"] == 2 and report.graph["changed"] == 0
    assert report.graph["assertions"] > 10

    facts = _rows(
        db.dsn,
        """
        SELECT a.*, s.path AS key, o.canonical_name AS object FROM graph_assertions a
        JOIN kb_sources s ON s.org_id = a.org_id AND s.id = a.source_id
        JOIN graph_entities o ON o.org_id = a.org_id AND o.id = a.object_id
        WHERE a.org_id = %s
        """,
        org,
    )
    assert len(facts) == report.graph["assertions"]
    files = {"corpus/runbook.md": DOC.encode(), "corpus/notes.txt": b"Contact lead@example.com.\n"}
    for f in facts:
        data = files[f["key"]]
        assert data[f["byte_start"] : f["byte_end"]].decode() == f["object"]
        assert f["line_start"] == data[: f["byte_start"]].count(b"\n") + 1 == f["line_end"]
        assert (f["method"], f["method_version"], f["source_version"]) == (
            "deterministic",
            "rules-1",
            1,
        )
    run = _rows(db.dsn, "SELECT * FROM graph_extraction_runs WHERE org_id = %s", org)
    assert [(r["status"], r["sources"], r["assertions"]) for r in run] == [("DONE", 2, len(facts))]

    graph = GraphStore(db)
    found = await graph.search(org, Reader("alice"), terms=["OPS-1234"], depth=2)
    cited = {f.citation for f in found.facts if f.object.name == "OPS-1234"}
    assert "corpus/runbook.md:3-3 @v1" in cited
    assert "ops@example.com" in {e.name for e in found.entities}  # two hops, via the document

    # A new version: what the old one said is closed, not deleted; what it still says holds.
    (corpus / "runbook.md").write_text("# Runbook ☃\n\nPage oncall@example.com now.\n")
    again = run_ingest(org, "ops", [corpus], dsn=db.dsn, embed=False, graph=True)
    assert again.graph is not None and again.graph["files"] == 1  # notes.txt is unchanged
    now = await graph.facts(org, Reader("alice"), limit=500)
    names = {f.object.name for f in now if f.path == "corpus/runbook.md"}
    assert names == {"Runbook ☃", "oncall@example.com"}
    assert {f.source_version for f in now if f.path == "corpus/runbook.md"} == {2}
    kept = _rows(
        db.dsn,
        "SELECT count(*) AS n FROM graph_assertions WHERE org_id = %s AND source_version = 1 "
        "AND valid_to IS NOT NULL",
        org,
    )
    assert kept[0]["n"] == sum(1 for f in facts if f["key"] == "corpus/runbook.md")
    before = await graph.facts(org, Reader("alice", known_at=report_time(db.dsn, org)), limit=500)
    assert "OPS-1234" in {f.object.name for f in before}


def report_time(dsn: str, org: str) -> Any:
    """When the first extraction run finished: the graph as it was recorded then."""
    return _rows(
        dsn,
        "SELECT min(finished_at) AS t FROM graph_extraction_runs WHERE org_id = %s",
        org,
    )[0]["t"]


@pytest.mark.integration
def test_graph_only_extracts_published_versions_once_without_ingesting(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    """A collection ingested without the stage gets its facts from a ``--graph-only`` pass
    over its published versions; a rerun finds nothing to do; a file changed on disk since
    is reported, not extracted."""
    import json

    import typer
    from typer.testing import CliRunner

    from jobs.ingest import main as ingest_main
    from jobs.ingest import run_graph_only, run_ingest

    main = typer.Typer()
    main.command()(ingest_main)

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "runbook.md").write_text(DOC)
    (corpus / "notes.txt").write_text("Contact lead@example.com.\n")
    (corpus / "later.md").write_text("See OPS-9.\n")
    ingested = run_ingest(org, "old", [corpus], dsn=db.dsn, embed=False, graph=False)
    assert ingested.graph is None
    generations = _rows(db.dsn, "SELECT count(*) AS n FROM kb_generations WHERE org_id = %s", org)
    (corpus / "later.md").write_text("Changed since: OPS-10.\n")

    report = run_graph_only(org, "old", [corpus], dsn=db.dsn)
    assert (report.published, report.files, report.changed) == (3, 2, ["corpus/later.md"])
    facts = _rows(
        db.dsn,
        """
        SELECT a.*, s.path AS key, o.canonical_name AS object FROM graph_assertions a
        JOIN kb_sources s ON s.org_id = a.org_id AND s.id = a.source_id
        JOIN graph_entities o ON o.org_id = a.org_id AND o.id = a.object_id
        WHERE a.org_id = %s
        """,
        org,
    )
    assert len(facts) == report.assertions > 10
    files = {"corpus/runbook.md": DOC.encode(), "corpus/notes.txt": b"Contact lead@example.com.\n"}
    for f in facts:
        assert files[f["key"]][f["byte_start"] : f["byte_end"]].decode() == f["object"]
    # Nothing was ingested: no new generation.
    assert (
        _rows(db.dsn, "SELECT count(*) AS n FROM kb_generations WHERE org_id = %s", org)
        == generations
    )

    # Rerun through the command line: the two extracted versions are in the ledger.
    result = CliRunner().invoke(
        main,
        ["--org", org, "--collection", "old", "--graph-only", "--database-url", db.dsn,
         str(corpus)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout.strip().splitlines()[-1])
    assert (again["published"], again["files"], again["changed"]) == (1, 0, ["corpus/later.md"])
    count = _rows(db.dsn, "SELECT count(*) AS n FROM graph_assertions WHERE org_id = %s", org)
    assert count[0]["n"] == len(facts)
    bad = CliRunner().invoke(
        main, ["--org", org, "--collection", "old", "--graph-only", "--dry-run", str(corpus)]
    )
    assert bad.exit_code == 2 and "--graph-only" in bad.output
