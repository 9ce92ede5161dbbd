"""The model-based extractor (jobs.graph_extract): facts whose evidence is not verbatim in
the passage never reach the record, bad model output is counted and dropped, every stored
span reads back to the file's exact bytes, runs are recorded, and a rerun asks nothing and
writes nothing twice. Once with the scripted model (exact facts), once through the real path
(SmolLM2 in a Ray actor of the job)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from cortex_ray.graph import Passage, locate, plan_batches
from cortex_ray.models import ChatRequest, ScriptedModelClient
from cortex_ray.storage import Database

DOC = """# Services

The billing-api service is owned by team Payments ☃ since 2025.
It depends on postgres-main for invoices.

# Notes

Nothing to see here.
"""


def _rows(dsn: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, params).fetchall()


def test_locate_maps_a_quote_to_the_files_bytes_and_lines() -> None:
    data = DOC.encode()
    start = data.index(b"The billing")
    end = data.index(b"# Notes")
    p = Passage("s", 1, 0, data[start:end].decode(), start, data[:start].count(b"\n") + 1)
    span = locate(p, "  team Payments ☃ since 2025.\nIt depends ")
    assert span is not None
    b0, b1, l0, l1 = span
    assert data[b0:b1].decode() == "team Payments ☃ since 2025.\nIt depends"
    assert (l0, l1) == (3, 4)
    assert locate(p, "team Payments since 2025") is None  # not verbatim
    assert locate(p, "   ") is None
    batches = plan_batches([p, p, p], batch_passages=2, batch_chars=10_000)
    assert [len(b) for b in batches] == [2, 1]
    assert [len(b) for b in plan_batches([p, p], batch_passages=5, batch_chars=10)] == [1, 1]


def _passages_of(request: ChatRequest) -> dict[int, str]:
    user = request.messages[-1].content or ""
    return {int(n): text for n, text in re.findall(r"Passage (\d+):\n<<<\n(.*?)\n>>>", user, re.S)}


def _answer(request: ChatRequest) -> str:
    """Facts for the passages shown: one supported, the rest each wrong in its own way."""
    facts: list[dict[str, Any]] = []
    for n, text in _passages_of(request).items():
        if "billing-api" not in text:
            continue
        base = {"passage": n, "subject_type": "Service", "object_type": "team"}
        facts += [
            # supported: quoted verbatim, names both ends (types and predicate normalised)
            {
                **base,
                "subject": "billing-api",
                "predicate": "Owned By",
                "object": "Payments ☃",
                "evidence": "billing-api service is owned by team Payments ☃",
            },
            # hallucinated: the quote is not in the passage
            {
                **base,
                "subject": "billing-api",
                "predicate": "runs_on",
                "object": "Kubernetes",
                "evidence": "billing-api runs on Kubernetes",
            },
            # the quote is there, but it does not name the subject
            {
                **base,
                "subject": "ledger-db",
                "predicate": "depends_on",
                "object": "postgres-main",
                "evidence": "It depends on postgres-main",
            },
            # invalid: an empty predicate
            {
                **base,
                "subject": "billing-api",
                "predicate": "",
                "object": "postgres-main",
                "evidence": "depends on postgres-main",
            },
        ]
    return json.dumps({"facts": facts})


@pytest.mark.integration
def test_only_facts_with_verbatim_evidence_are_written_and_a_rerun_adds_nothing(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    from jobs.graph_extract import ExtractOptions, run_model_extraction
    from jobs.ingest import run_ingest

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "services.md").write_text(DOC)
    (corpus / "empty.md").write_text("# Empty\n\nNo relationships at all.\n")
    run_ingest(org, "svc", [corpus], dsn=db.dsn, embed=False, graph=False)

    # The first call's answer is not JSON, its retry is not JSON either: that batch is
    # counted as invalid output and dropped; every later call is answered by the responder.
    model = ScriptedModelClient(["not json", "{]"], responder=_answer, name="scripted-1")
    options = ExtractOptions(batch_passages=1, retries=1, in_flight=1)
    report = run_model_extraction(
        org, dsn=db.dsn, collection="svc", model_version="scripted-1", options=options,
        client=model,
    )  # fmt: skip
    passages = _rows(db.dsn, "SELECT * FROM kb_passages WHERE org_id = %s", org)
    assert report.versions == 2
    assert report.passages == len(passages) == report.calls
    assert report.invalid_outputs == 1
    assert report.method_version == "scripted-1/prompt-1"

    facts = _rows(
        db.dsn,
        """
        SELECT a.*, s.path AS key, su.canonical_name AS subject, su.type AS s_type,
               o.canonical_name AS object, o.type AS o_type
        FROM graph_assertions a
        JOIN kb_sources s ON s.org_id = a.org_id AND s.id = a.source_id
        JOIN graph_entities su ON su.org_id = a.org_id AND su.id = a.subject_id
        JOIN graph_entities o ON o.org_id = a.org_id AND o.id = a.object_id
        WHERE a.org_id = %s
        """,
        org,
    )
    # Versions go in path order: the invalid answers were empty.md's first passage's.
    assert "billing-api" not in (model.requests[0].messages[-1].content or "")
    answered = 1
    got = [(f["s_type"], f["subject"], f["predicate"], f["o_type"], f["object"]) for f in facts]
    assert got == [("service", "billing-api", "owned_by", "team", "Payments ☃")]
    assert report.found == report.assertions == answered
    assert report.unsupported == 2 * answered and report.invalid_facts == answered
    data = DOC.encode()
    for f in facts:
        quote = data[f["byte_start"] : f["byte_end"]].decode()
        assert quote == "billing-api service is owned by team Payments ☃"
        assert f["line_start"] == f["line_end"] == data[: f["byte_start"]].count(b"\n") + 1
        assert (f["method"], f["method_version"], f["confidence"]) == (
            "model",
            "scripted-1/prompt-1",
            0.5,
        )
    run = _rows(db.dsn, "SELECT * FROM graph_extraction_runs WHERE org_id = %s", org)
    assert [(r["method"], r["status"], r["assertions"]) for r in run] == [
        ("model", "DONE", answered)
    ]
    assert json.loads(run[0]["detail"])["passages"] == len(passages)
    ledger = _rows(db.dsn, "SELECT * FROM graph_extracted_versions WHERE org_id = %s", org)
    assert len(ledger) == 2 and {r["method_version"] for r in ledger} == {"scripted-1/prompt-1"}

    # Rerun: every version is in the ledger, so the model is not asked and nothing is written.
    asked = len(model.requests)
    again = run_model_extraction(
        org, dsn=db.dsn, collection="svc", model_version="scripted-1", options=options,
        client=model,
    )  # fmt: skip
    assert (again.versions, again.calls, again.assertions) == (0, 0, 0)
    assert len(model.requests) == asked
    count = _rows(db.dsn, "SELECT count(*) AS n FROM graph_assertions WHERE org_id = %s", org)
    assert count[0]["n"] == len(facts)

    # Another extractor version extracts again; the same fact with the same evidence is one
    # assertion (the record's fingerprint), so nothing is duplicated either.
    other = run_model_extraction(
        org, dsn=db.dsn, collection="svc", model_version="scripted-2", options=options,
        client=model,
    )  # fmt: skip
    assert other.versions == 2 and other.found == 1 and other.assertions == 0
    count = _rows(db.dsn, "SELECT count(*) AS n FROM graph_assertions WHERE org_id = %s", org)
    assert count[0]["n"] == 1


REAL_DOC = """# Platform

The billing-api service is owned by the Payments team.
The billing-api service depends on the postgres-main database.
Alice Smith leads the Payments team.
"""


@pytest.mark.integration
@pytest.mark.allow_model_requests
def test_the_job_runs_the_packaged_model_in_a_ray_actor_and_keeps_only_verbatim_facts(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    """The real path: SmolLM2-135M (llama.cpp, JSON-schema grammar) opened by the job's Ray
    actor from the settings. It may find few or no valid facts; what it stores must read
    back, and the run must account for every passage and call."""
    from jobs.graph_extract import ExtractOptions, run_model_extraction
    from jobs.ingest import run_ingest

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "platform.md").write_text(REAL_DOC)
    run_ingest(org, "real", [corpus], dsn=db.dsn, embed=False, graph=False)
    passages = _rows(db.dsn, "SELECT * FROM kb_passages WHERE org_id = %s", org)
    assert passages

    options = ExtractOptions(batch_passages=2, retries=0, in_flight=1, max_tokens=256)
    report = run_model_extraction(
        org, dsn=db.dsn, collection="real", model_version="SmolLM2-135M-Instruct",
        options=options, actors=1,
    )  # fmt: skip
    assert report.versions == 1
    assert report.passages == len(passages)
    assert report.calls == -(-len(passages) // 2)
    kept_or_dropped = report.found + report.unsupported + report.invalid_facts
    assert kept_or_dropped >= 0 and report.invalid_outputs <= report.calls

    facts = _rows(
        db.dsn,
        """
        SELECT a.*, su.canonical_name AS subject, o.canonical_name AS object
        FROM graph_assertions a
        JOIN graph_entities su ON su.org_id = a.org_id AND su.id = a.subject_id
        JOIN graph_entities o ON o.org_id = a.org_id AND o.id = a.object_id
        WHERE a.org_id = %s
        """,
        org,
    )
    assert len(facts) == report.assertions <= report.found
    data = REAL_DOC.encode()
    for f in facts:
        quote = data[f["byte_start"] : f["byte_end"]].decode().lower()
        assert f["subject"].lower() in quote and f["object"].lower() in quote
        assert f["line_start"] == data[: f["byte_start"]].count(b"\n") + 1
        assert (f["method"], f["method_version"]) == ("model", "SmolLM2-135M-Instruct/prompt-1")
    run = _rows(db.dsn, "SELECT * FROM graph_extraction_runs WHERE org_id = %s", org)
    assert [(r["method"], r["status"]) for r in run] == [("model", "DONE")]
    detail = json.loads(run[0]["detail"])
    assert (detail["versions"], detail["passages"], detail["calls"]) == (
        1,
        len(passages),
        report.calls,
    )
    ledger = _rows(db.dsn, "SELECT * FROM graph_extracted_versions WHERE org_id = %s", org)
    assert [(r["method"], r["passages"], r["assertions"]) for r in ledger] == [
        ("model", len(passages), len(facts))
    ]
