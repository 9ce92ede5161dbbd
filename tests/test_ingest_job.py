"""The ingestion job on a real local Ray (Ray Data) and a real PostgreSQL: counts, exact
passages, eager section vectors, health events, re-ingest of unchanged content, and the job
run as a process through ``cortex-ray ingest`` (→ ``python -m jobs.ingest``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from cortex_ray.storage import Database

pytest.importorskip("ray")

from jobs.ingest import IngestReport, run_ingest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]

GUIDE = """# Guide

Welcome to the guide.

## Install

Run the installer, then restart.

## Use

Open the program.
"""

REF = """Reference
=========

Overview text.

Options
-------

``--fast``  go fast.
"""


def make_corpus(root: Path) -> Path:
    corpus = root / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "guide.md").write_text(GUIDE)
    (corpus / "sub" / "ref.rst").write_text(REF)
    (corpus / "notes.txt").write_text("First note.\n\nSecond note, ünïcode ☃.\n")
    (corpus / "README").write_text("A file with no extension.\n")
    para = "A sentence of prose. " * 40 + "\n\n"
    big = "".join(f"## Part {i}\n\n" + para * 300 for i in range(4))
    (corpus / "big.md").write_text(big)  # ~1 MB, ~1,200 passages, 4 sections
    (corpus / "binary.txt").write_bytes(b"\x00\x01\x02 not text")
    (corpus / "bad.md").write_bytes(b"good line\n\xff\xfe\n")
    (corpus / "empty.md").write_bytes(b"")
    (corpus / "minified.txt").write_bytes(b"x" * 10_000)
    (corpus / "image.png").write_bytes(b"\x89PNG")
    return corpus


def rows(dsn: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, params).fetchall()


def published_passages(dsn: str, org: str, collection: str) -> list[dict[str, Any]]:
    return rows(
        dsn,
        """
        SELECT s.path, p.ordinal, p.section_ordinal, p.text, p.line_start, p.line_end,
               p.byte_start, p.byte_end
        FROM kb_collections c
        JOIN kb_generation_sources m
          ON m.org_id = c.org_id AND m.generation = c.published_generation
        JOIN kb_sources s ON s.org_id = m.org_id AND s.id = m.source_id
        JOIN kb_passages p ON p.org_id = m.org_id AND p.source_id = m.source_id
                          AND p.version = m.version
        WHERE c.org_id = %s AND c.name = %s ORDER BY s.path, p.ordinal
        """,
        org,
        collection,
    )


def traced(dsn: str, trace_id: str, names: set[str], timeout_s: float = 20) -> list[Any]:
    """The spans of ``trace_id`` once one of each of ``names`` is kept (workers export them
    every half second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = rows(dsn, "SELECT * FROM trace_spans WHERE trace_id = %s", trace_id)
        if names <= {s["name"] for s in spans} or time.monotonic() > deadline:
            return spans
        time.sleep(0.25)


def test_ingest_streams_splits_writes_and_publishes(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    corpus = make_corpus(tmp_path)
    report = run_ingest(org, "docs", [corpus], dsn=db.dsn, embed=True, max_line_bytes=4096)

    assert report.files == 10
    assert report.read == 5
    assert report.unchanged == 0 and report.failed == 0
    assert report.skipped == {
        "binary": 1,
        "empty": 1,
        "invalid_utf8": 1,
        "line_too_long": 1,
        "unsupported_type": 1,
    }
    assert report.published is not None
    assert report.published["passages"] == report.passages > 400

    # Every stored passage is exactly its byte range of the file, with the right lines.
    stored = published_passages(db.dsn, org, "docs")
    assert len(stored) == report.passages
    for p in stored:
        data = (tmp_path / p["path"]).read_bytes()
        assert data[p["byte_start"] : p["byte_end"]].decode() == p["text"]
        assert data[: p["byte_start"]].count(b"\n") + 1 == p["line_start"]

    sections = rows(
        db.dsn,
        "SELECT s.path, k.heading_path, k.embedding IS NOT NULL AS embedded "
        "FROM kb_sections k JOIN kb_sources s ON s.org_id = k.org_id AND s.id = k.source_id "
        "WHERE k.org_id = %s ORDER BY s.path, k.ordinal",
        org,
    )
    assert len(sections) == report.sections
    assert all(s["embedded"] for s in sections)  # section vectors are eager
    paths = {(s["path"], tuple(s["heading_path"])) for s in sections}
    assert ("corpus/guide.md", ("Guide", "Install")) in paths
    assert ("corpus/sub/ref.rst", ("Reference", "Options")) in paths
    assert ("corpus/notes.txt", ()) in paths

    # One trace for the job: its ``ingest`` span, and beneath it a span per read task (in
    # the Ray workers) and per section batch (in the section writer's actor).
    assert report.trace_id is not None
    spans = traced(db.dsn, report.trace_id, {"ingest docs", "ingest unit", "embed sections"})
    (root,) = [s for s in spans if s["name"] == "ingest docs"]
    assert root["parent_span_id"] is None and root["attributes"]["cortex.files"] == 10
    units = [s for s in spans if s["name"] == "ingest unit"]
    batches = [s for s in spans if s["name"] == "embed sections"]
    assert units and batches
    assert {s["parent_span_id"] for s in units + batches} == {root["span_id"]}
    assert sum(s["attributes"]["cortex.files"] for s in units) == 10
    assert sum(s["attributes"]["cortex.sections"] for s in batches) == report.sections

    health = {
        r["path"]: (r["health"], r["health_detail"])
        for r in rows(
            db.dsn, "SELECT path, health, health_detail FROM kb_sources WHERE org_id = %s", org
        )
    }
    assert health["corpus/binary.txt"] == ("SKIPPED", "binary")
    assert health["corpus/bad.md"] == ("SKIPPED", "invalid_utf8")
    assert health["corpus/minified.txt"] == ("SKIPPED", "line_too_long")
    assert health["corpus/guide.md"][0] == "READ_OK"
    assert "corpus/image.png" not in health  # not a source

    # Re-ingest: nothing changed → everything carried forward, nothing rewritten.
    again = run_ingest(org, "docs", [corpus], dsn=db.dsn, embed=False, max_line_bytes=4096)
    assert (again.read, again.unchanged, again.passages) == (0, 5, 0)
    assert again.published is not None and again.published["passages"] == report.passages

    # One file edited, one deleted: only the edit is split; the deletion is recorded.
    (corpus / "notes.txt").write_text("A rewritten note.\n")
    (corpus / "README").unlink()
    third = run_ingest(org, "docs", [corpus], dsn=db.dsn, embed=False, max_line_bytes=4096)
    assert (third.read, third.unchanged, third.passages) == (1, 3, 1)
    assert third.disappeared == ["corpus/README"]
    texts = {p["text"] for p in published_passages(db.dsn, org, "docs") if "notes" in p["path"]}
    assert texts == {"A rewritten note."}
    gone = rows(
        db.dsn,
        "SELECT e.event FROM kb_source_events e JOIN kb_sources s "
        "ON s.org_id = e.org_id AND s.id = e.source_id WHERE e.org_id = %s AND s.path = %s "
        "ORDER BY e.id",
        org,
        "corpus/README",
    )
    assert [r["event"] for r in gone] == ["READ_OK", "READ_OK", "DISAPPEARED"]


def test_cli_runs_the_job_as_a_process(
    ray_cluster: Any, db: Database, org: str, tmp_path: Path
) -> None:
    """``cortex-ray ingest`` execs ``python -m jobs.ingest``, which joins the running Ray."""
    corpus = make_corpus(tmp_path)
    cli = Path(sys.executable).with_name("cortex-ray")
    result = subprocess.run(
        [
            str(cli),
            "--org",
            org,
            "ingest",
            "docs",
            str(corpus),
            "--no-embed",
            "--max-line-bytes",
            "4096",
            "--address",
            ray_cluster.address_info["address"],
            "--database-url",
            db.dsn,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = IngestReport(**json.loads(result.stdout.strip().splitlines()[-1]))
    assert (report.files, report.read, report.failed) == (10, 5, 0)
    assert sum(report.skipped.values()) == 5
    assert "ingest:" in result.stderr  # progress lines (stderr is not a terminal here)
    assert len(published_passages(db.dsn, org, "docs")) == report.passages


def test_cli_reports_a_missing_path(db: Database, org: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.ingest",
            "--org",
            org,
            "--collection",
            "docs",
            "--database-url",
            db.dsn,
            str(tmp_path / "nope"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no such file or folder" in result.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _own_ray_pids(temp_dir: Path) -> list[int]:
    """Processes of the cluster this test started: their command lines name its temp dir."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(temp_dir).encode() in cmdline and int(entry) != os.getpid():
                pids.append(int(entry))
    return pids


def _wait_for_http(url: str, timeout: float) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (401 with token auth): it is up
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_ray_job_submit_end_to_end(db: Database, org: str, tmp_path: Path) -> None:
    """``ray job submit --working-dir . -- python -m jobs.ingest ...`` against a separate
    cluster started here with ``ray start --head --block`` (token auth off on both sides, see
    FACTS.md). The cluster is stopped by killing only the processes it started."""
    import signal
    import uuid

    ray_cli = Path(sys.executable).with_name("ray")
    corpus = make_corpus(tmp_path)
    # No 30 s drain on SIGTERM (`ray start --block` waits for Serve's proxies on a live
    # cluster): the cluster is torn down whole at the end.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    dashboard = _free_port()
    temp_dir = Path("/tmp") / f"rs-{uuid.uuid4().hex[:8]}"
    # Every fixed default port may be held by another Ray on this machine (the dashboard
    # agent's 52365, for one): give each its own free port.
    ports = [
        f"--{name}={_free_port()}"
        for name in (
            "port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "ray-client-server-port",
        )
    ]
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", "--num-cpus", "1", *ports,
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
         "--include-dashboard", "true", "--temp-dir", str(temp_dir), "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"http://127.0.0.1:{dashboard}"
    try:
        _wait_for_http(f"{address}/api/version", timeout=90)
        command = [
            str(ray_cli), "job", "submit", "--address", address, "--working-dir", ".",
            "--", sys.executable, "-m", "jobs.ingest", "--org", org, "--collection", "docs",
            "--no-embed", "--max-line-bytes", "4096", "--database-url", db.dsn, str(corpus),
        ]  # fmt: skip
        deadline = time.monotonic() + 60  # the job agent registers after the dashboard
        while True:
            submit = subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
            )
            if "No available agent" not in submit.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert submit.returncode == 0, (submit.stdout + submit.stderr)[-4000:]
        assert "succeeded" in submit.stdout
        report_line = next(line for line in submit.stdout.splitlines() if line.startswith('{"org"'))
        report = IngestReport(**json.loads(report_line))
        assert (report.files, report.read, report.failed) == (10, 5, 0)
        assert len(published_passages(db.dsn, org, "docs")) == report.passages
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        for pid in _own_ray_pids(temp_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_backfill_embeds_published_passages(
    ray_cluster: object, db: Database, org: str, tmp_path: Path, minilm: object
) -> None:
    from jobs.backfill import backfill

    corpus = tmp_path / "small"
    corpus.mkdir()
    (corpus / "guide.md").write_text(GUIDE)
    (corpus / "notes.txt").write_text("".join(f"Note {i}.\n\n" for i in range(60)))
    report = run_ingest(org, "docs", [corpus], dsn=db.dsn, embed=False, max_passage_bytes=16)
    assert report.passages > 40

    def embedded() -> int:
        return int(
            rows(
                db.dsn,
                "SELECT count(*) AS n FROM kb_passages WHERE org_id = %s AND embedding IS NOT NULL",
                org,
            )[0]["n"]
        )

    # the packaged MiniLM in this process (the job's default is a Ray actor holding it)
    assert backfill(org, "docs", dsn=db.dsn, limit=25, batch=10, embedder=minilm) == 25
    assert embedded() == 25
    assert backfill(org, "docs", dsn=db.dsn, batch=16, embedder=minilm) == report.passages - 25
    assert embedded() == report.passages


def test_a_retried_read_task_writes_nothing_twice(db: Database, org: str, tmp_path: Path) -> None:
    """One read task run in-process, then again (as Ray retries a failed task): files are
    registered in one batch, written in shared batches (``write_batch`` small enough that the
    big file streams in several), and the retry adds no version, passage or posting."""
    import pyarrow as pa

    from cortex_ray.knowledge import KnowledgeWriter, list_files
    from jobs._pipeline import IngestOptions, ingest_unit

    files = list(list_files([make_corpus(tmp_path)]))
    with KnowledgeWriter(db.dsn) as writer:
        gen = writer.begin_generation(org, "docs")
    options = IngestOptions(
        dsn=db.dsn, generation=gen, embed=False, max_line_bytes=4096, write_batch=500
    )

    def counts() -> dict[str, Any]:
        return rows(
            db.dsn,
            "SELECT (SELECT count(*) FROM kb_source_versions WHERE org_id = %s) AS versions, "
            "(SELECT count(*) FROM kb_passages WHERE org_id = %s) AS passages, "
            "(SELECT count(*) FROM kb_postings WHERE org_id = %s) AS postings, "
            "(SELECT count(*) FROM kb_sections WHERE org_id = %s) AS sections, "
            "(SELECT count(*) FROM kb_generation_sources WHERE org_id = %s) AS members",
            org,
            org,
            org,
            org,
            org,
        )[0]

    first = pa.concat_tables(list(ingest_unit(files, options))).to_pylist()
    written = counts()
    again = pa.concat_tables(list(ingest_unit(files, options))).to_pylist()
    assert counts() == written
    assert [(r["key"], r["status"], r["passages"]) for r in again] == [
        (r["key"], r["status"], r["passages"]) for r in first
    ]
    assert [r["kind"] for r in first] == ["file"] * len(files)
    statuses = [r["status"] for r in first]
    assert statuses.count("written") == 5 and statuses.count("skipped") == 5
    assert written["versions"] == written["members"] == 5
    assert written["passages"] == sum(r["passages"] for r in first) > 1000
    health = rows(
        db.dsn, "SELECT path, health FROM kb_sources WHERE org_id = %s ORDER BY path", org
    )
    assert {r["path"]: r["health"] for r in health} == {
        "corpus/README": "READ_OK",
        "corpus/bad.md": "SKIPPED",
        "corpus/big.md": "READ_OK",
        "corpus/binary.txt": "SKIPPED",
        "corpus/empty.md": "SKIPPED",
        "corpus/guide.md": "READ_OK",
        "corpus/minified.txt": "SKIPPED",
        "corpus/notes.txt": "READ_OK",
        "corpus/sub/ref.rst": "READ_OK",
    }


def test_units_group_small_files_stream_big_ones_alone_and_fit_the_cluster() -> None:
    from cortex_ray.knowledge import ListedFile
    from jobs._pipeline import plan_units, unit_size

    mib = 1 << 20
    files = [ListedFile(f"/c/{i}", f"c/{i}", mib // 4) for i in range(10)]
    files.append(ListedFile("/c/big", "c/big", 5 * mib))
    units = plan_units(files, unit_bytes=mib, unit_files=3)
    assert units[0] == [files[-1]]  # the big file alone, first
    assert [len(u) for u in units[1:]] == [3, 3, 3, 1]  # in listing order, ≤ 3 files each
    assert sorted(f.key for u in units for f in u) == sorted(f.key for f in files)
    # About four units per CPU, within [1 MiB, 8 MiB].
    assert unit_size(40 * mib, 2) == 5 * mib
    assert unit_size(40 * mib, 64) == mib
    assert unit_size(10_000 * mib, 2) == 8 * mib


def test_an_unreadable_file_keeps_its_published_version(
    ray_cluster: object, db: Database, org: str, tmp_path: Path
) -> None:
    """A file that cannot be read this time is not a deleted file: the new publication still
    serves its published version, the failure is recorded and reported."""
    corpus = make_corpus(tmp_path)
    first = run_ingest(org, "keep", [corpus], dsn=db.dsn, embed=False, max_line_bytes=4096)
    guide = [p for p in published_passages(db.dsn, org, "keep") if p["path"].endswith("guide.md")]
    assert guide

    (corpus / "guide.md").unlink()
    (corpus / "guide.md").symlink_to(tmp_path / "nowhere.md")  # listed, but cannot be opened
    second = run_ingest(org, "keep", [corpus], dsn=db.dsn, embed=False, max_line_bytes=4096)
    assert (second.failed, second.kept, second.read, second.unchanged) == (1, 1, 0, 4)
    assert second.disappeared == []
    [(path, reason)] = second.failures
    assert path == "corpus/guide.md" and reason.startswith("unreadable: ")
    assert reason.endswith("(published version 1 kept)")
    assert second.published is not None
    assert second.published["passages"] == first.published["passages"]  # type: ignore[index]
    served = published_passages(db.dsn, org, "keep")
    assert [p for p in served if p["path"].endswith("guide.md")] == guide
    health = rows(
        db.dsn,
        "SELECT health FROM kb_sources WHERE org_id = %s AND collection = 'keep' AND path = %s",
        org,
        "corpus/guide.md",
    )
    assert health == [{"health": "READ_FAILURE"}]


def test_a_file_that_fails_mid_split_leaves_no_partial_version(
    db: Database, org: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big file whose content changes while it is split (after some of its batches were
    written): the run serves its published version, and the version registered for it is
    retired, so a later run with that content writes it whole instead of reusing the mixed
    rows."""
    import jobs._pipeline as pipeline
    from cortex_ray.knowledge import (
        Format,
        KnowledgeWriter,
        SourceVersion,
        SplitSection,
        list_files,
        read_chunks,
        split_bytes,
    )

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    big = corpus / "big.md"

    def text(word: str) -> str:
        para = f"A sentence about {word}. " * 30 + "\n\n"
        return "".join(f"## Part {i}\n\n" + para * 150 for i in range(4))

    def run(late_sections: bool = False) -> list[dict[str, Any]]:
        with KnowledgeWriter(db.dsn) as writer:
            gen = writer.begin_generation(org, "partial")
            options = pipeline.IngestOptions(
                dsn=db.dsn, generation=gen, embed=False, chunk_bytes=16 << 10, write_batch=100
            )
            out = pa.concat_tables(
                list(pipeline.ingest_unit(list(list_files([corpus])), options))
            ).to_pylist()
            if late_sections:
                # With --embed, a failed file's sections reach the section writer on their
                # own schedule, possibly after the failure was handled; that write makes the
                # failed version a member again, and publish must not serve it.
                [v] = rows(
                    db.dsn,
                    "SELECT v.source_id, v.version FROM kb_source_versions v "
                    "WHERE v.org_id = %s AND v.version = 2",
                    org,
                )
                failed = SourceVersion(
                    org_id=org,
                    collection="partial",
                    path="corpus/big.md",
                    source_id=v["source_id"],
                    version=2,
                    unchanged=False,
                )
                section = next(
                    r
                    for r in split_bytes(text("pears").encode(), Format.MARKDOWN)
                    if isinstance(r, SplitSection)
                )
                writer.write_sections(gen, failed, [section])
            writer.mark_disappeared(gen, ["corpus/big.md"])
            writer.publish(gen)
        return out

    def served() -> list[str]:
        return [p["text"] for p in published_passages(db.dsn, org, "partial")]

    import pyarrow as pa

    big.write_text(text("apples"))
    assert [r["status"] for r in run()] == ["written"]
    apples = served()
    assert len(apples) > 500

    # The file now holds "pears", but what the split reads turns into "plums" half way.
    big.write_text(text("pears"))
    plums = text("plums").encode()

    def changing(path: str | Path, chunk_bytes: int) -> Any:
        for i, chunk in enumerate(read_chunks(path, chunk_bytes)):
            yield chunk if i < 12 else plums[i * chunk_bytes : (i + 1) * chunk_bytes]

    monkeypatch.setattr(pipeline, "read_chunks", changing)
    [row] = [r for r in run(late_sections=True) if r["kind"] == "file"]
    assert (row["status"], row["reason"], row["version"]) == (
        "failed",
        "changed while being read",
        1,
    )
    assert served() == apples  # the published version, not the batches written before
    retired = rows(
        db.dsn,
        "SELECT v.version, v.content_hash FROM kb_source_versions v JOIN kb_sources s "
        "ON s.org_id = v.org_id AND s.id = v.source_id "
        "WHERE v.org_id = %s AND s.collection = 'partial' ORDER BY v.version",
        org,
    )
    assert [r["version"] for r in retired] == [1, 2]
    assert ":failed:" in retired[1]["content_hash"]

    # Read properly, "pears" is a new version written whole: every passage is its bytes.
    monkeypatch.setattr(pipeline, "read_chunks", read_chunks)
    [row] = [r for r in run() if r["kind"] == "file"]
    assert row["status"] == "written"
    published = rows(
        db.dsn,
        "SELECT m.version FROM kb_collections c JOIN kb_generation_sources m "
        "ON m.org_id = c.org_id AND m.generation = c.published_generation "
        "WHERE c.org_id = %s AND c.name = 'partial'",
        org,
    )
    assert published == [{"version": 3}]
    data = big.read_bytes()
    stored = published_passages(db.dsn, org, "partial")
    assert stored and all("pears" in p["text"] for p in stored)
    assert all(data[p["byte_start"] : p["byte_end"]].decode() == p["text"] for p in stored)


def _hold_cpus(cpus: float) -> Any:
    """An actor that reserves ``cpus`` of the test cluster, as the local stack's replicas
    do (the API 0.5, each served model 0.5); alive once this returns."""
    import ray

    @ray.remote(num_cpus=cpus)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()  # type: ignore[attr-defined]
    assert ray.get(holder.ready.remote(), timeout=60)
    return holder


def _release(holder: Any, cpus: float) -> None:
    """Kill the holder and wait until its CPUs are free again (``ray.kill`` returns first)."""
    import ray

    ray.kill(holder)
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < cpus:  # type: ignore[no-untyped-call]
        assert time.monotonic() < deadline, "the holder's CPUs did not come back"
        time.sleep(0.2)


def test_ingest_fits_beside_a_stack_that_holds_most_cpus(
    ray_cluster: object, db: Database, org: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With only half a CPU free (the local stack on 2 CPUs), the read and graph stages ask
    a share of it, one task at a time, instead of a whole CPU each, which never came."""
    import ray

    free = ray.available_resources()["CPU"]  # type: ignore[no-untyped-call]
    holder = _hold_cpus(free - 0.5)  # whatever else the test run left holds the rest
    try:
        corpus = make_corpus(tmp_path)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            ingest = pool.submit(run_ingest, org, "fit", [corpus], dsn=db.dsn, embed=False,
                                 max_line_bytes=4096)  # fmt: skip
            try:
                report = ingest.result(timeout=180)
            except concurrent.futures.TimeoutError:
                ray.kill(holder)  # lets the hung job end; the test fails either way
                ingest.result(timeout=180)
                pytest.fail("the ingest job waited for CPUs the holder reserved")
    finally:
        _release(holder, free)
    assert (report.read, report.failed) == (5, 0)
    assert report.published is not None and report.graph is not None
    said = capsys.readouterr().err
    assert "ingest: the tasks fit beside the cluster's others: 0.25 CPU each, 1 at a time" in said
    assert "(0.5 of 2 CPUs free" in said and "waiting for resources" not in said


def test_ingest_says_what_it_waits_for_when_nothing_is_free(
    ray_cluster: object, db: Database, org: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every CPU reserved: the job says within seconds what a task asks and what is free,
    and goes on once CPUs are freed."""
    import ray

    free = ray.available_resources()["CPU"]  # type: ignore[no-untyped-call]
    holder = _hold_cpus(free)
    corpus = make_corpus(tmp_path)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ingest = pool.submit(run_ingest, org, "wait", [corpus], dsn=db.dsn, embed=False,
                             max_line_bytes=4096)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            said = ""
            while "waiting for resources" not in said and time.monotonic() < deadline:
                assert not ingest.done(), "it ran with every CPU reserved?"
                time.sleep(0.5)
                said += capsys.readouterr().err
        finally:
            _release(holder, free)
        report = ingest.result(timeout=180)
    assert (
        "ingest: no result for 5 s, waiting for resources: each task asks 1 CPU and the "
        "cluster has 0 of 2 CPUs free"
    ) in said, said
    assert "`ray status` lists the demand" in said
    assert (report.read, report.failed) == (5, 0)
