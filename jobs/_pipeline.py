"""The ingestion pipeline on Ray Data: a custom datasource whose read tasks stream files.

Shape (one streaming Dataset, executed by Ray Data's streaming executor)::

    SourceFilesDatasource          read tasks, one per unit of files (≤ unit_bytes, or one big
      │                            file): check → register → split → write passages (COPY)
      │  blocks of small rows:     "file" (one per file: outcome and counts), "progress"
      │                            (every progress_bytes of a big file), "section" (to embed)
      ▼
    SectionWriter (actor pool)     embeds section summaries (MiniLM) and writes the sections
      │                            with their vectors; passes the other rows through
      ▼
    extract_graph (tasks)          for each file row of a written version: the deterministic
      │                            extractor's facts (cortex_ray.graph), "graph" rows out
      ▼
    driver                         iter_batches → counts, progress bar, then publish

Passages are written where they are produced, by the read task, in batches: the bulk of the
bytes never travels through the object store, and a read task holds at most one batch of
passages, one chunk of the file and the splitter's state (one passage, one line). A file of
any size is therefore read with bounded memory: it is one read task that reads it
sequentially in ``chunk_bytes`` pieces and yields a block at least every ``progress_bytes``,
so the driver sees progress and Ray Data's backpressure applies between blocks.

With ``embed=False`` (the pure lexical tier) the read task writes sections too, without
vectors, and the dataset has no actor stage.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from opentelemetry.trace import Status, StatusCode
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from cortex_ray.knowledge import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_PASSAGE_BYTES,
    Document,
    Generation,
    HealthEvent,
    HealthRecord,
    KnowledgeWriter,
    LineTooLongError,
    ListedFile,
    ScanResult,
    SkipReason,
    SourceFile,
    SourceVersion,
    Span,
    SplitPassage,
    SplitSection,
    Splitter,
    read_chunks,
    scan_file,
)
from cortex_ray.observability import server_span, start_child_span
from jobs._spans import task_tracing

__all__ = [
    "ROW_SCHEMA",
    "DryRunWriter",
    "IngestOptions",
    "SectionWriter",
    "SourceFilesDatasource",
    "extract_graph",
    "ingest_unit",
    "plan_units",
    "unit_size",
]

log = logging.getLogger("cortex_ray.jobs.ingest")

# Every block the pipeline yields has this schema, so blocks concatenate without unification.
ROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),  # file | progress | section
        ("key", pa.string()),  # the registry path
        ("status", pa.string()),  # file rows: written | unchanged | skipped | failed
        ("reason", pa.string()),  # skip reason or failure detail
        ("bytes", pa.int64()),  # file: size; progress: bytes read since the last row
        ("sections", pa.int64()),
        ("passages", pa.int64()),
        ("source_id", pa.string()),
        ("version", pa.int64()),
        ("ordinal", pa.int64()),  # section rows from here on
        ("heading_path", pa.list_(pa.string())),
        ("line_start", pa.int64()),
        ("line_end", pa.int64()),
        ("byte_start", pa.int64()),
        ("byte_end", pa.int64()),
        ("summary", pa.string()),
        ("path", pa.string()),  # file rows of written versions: the file read (graph stage)
        ("assertions", pa.int64()),  # graph rows: the facts written for the file
    ]
)


@dataclass(frozen=True)
class IngestOptions:
    """What every read task needs: picklable, shipped with the task."""

    dsn: str | None  # None: a dry run (check and split, write nothing)
    generation: Generation
    embed: bool = True
    chunk_bytes: int = 1 << 20
    max_passage_bytes: int = DEFAULT_MAX_PASSAGE_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    write_batch: int = 2000  # passages (or sections) per write call
    progress_bytes: int = 32 << 20  # a big file reports progress at least this often
    traceparent: str | None = None  # the job's ``ingest`` span: each task's span joins it


class _Rows:
    """Accumulates rows of ROW_SCHEMA column by column."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in ROW_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def add(self, **values: Any) -> None:
        for name, column in self.cols.items():
            column.append(values.get(name))

    def take(self) -> pa.Table:
        table = pa.Table.from_pydict(self.cols, schema=ROW_SCHEMA)
        self.cols = {name: [] for name in ROW_SCHEMA.names}
        return table


@dataclass
class _FileOutcome:
    status: str
    reason: str = ""
    sections: int = 0
    passages: int = 0
    # A read failure that should leave the published version serving (not a duplicate path);
    # ``source`` is the version registered for it when it failed while being split.
    keep_published: bool = False
    source: SourceVersion | None = None
    written: SourceVersion | None = None  # the version written (the graph stage reads it)

    def health(self) -> tuple[HealthEvent, str] | None:
        """The file's health event, or None when it is not a source (unsupported type)."""
        if self.status == "skipped":
            return None if self.reason == SkipReason.UNSUPPORTED.value else ("SKIPPED", self.reason)
        if self.status == "failed":
            return ("READ_FAILURE", self.reason)
        return ("READ_OK", "unchanged" if self.status == "unchanged" else "")


@dataclass
class _Batch:
    """What a read task has finished but not yet written: whole documents, health events and
    the files' rows. One ``write_documents`` transaction writes it all; the file rows go to
    the driver only after that commit, so a counted file is a written one."""

    writer: KnowledgeWriter | DryRunWriter
    options: IngestOptions
    rows: _Rows
    documents: list[Document] = field(default_factory=list)
    health: list[HealthRecord] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # paths whose read failed
    partial: list[SourceVersion] = field(default_factory=list)  # versions that failed mid-split
    records: int = 0

    def add_document(
        self, source: SourceVersion, sections: list[SplitSection], passages: list[SplitPassage]
    ) -> None:
        self.documents.append((source, sections, passages))
        self.records += len(sections) + len(passages)

    def file_done(self, f: ListedFile, outcome: _FileOutcome) -> None:
        health = outcome.health()
        if health is not None:
            self.health.append((f.key, *health))
        if outcome.keep_published:
            self.unread.append(f.key)
            if outcome.source is not None:
                self.partial.append(outcome.source)
        self.files.append(
            {
                "kind": "file",
                "key": f.key,
                "status": outcome.status,
                "reason": outcome.reason,
                "bytes": f.size,
                "sections": outcome.sections,
                "passages": outcome.passages,
                **(
                    {
                        "source_id": str(outcome.written.source_id),
                        "version": outcome.written.version,
                        "path": f.path,
                    }
                    if outcome.written is not None
                    else {}
                ),
            }
        )
        if self.records >= self.options.write_batch:
            self.flush()

    def flush(self) -> None:
        if self.documents or self.health:
            self.writer.write_documents(self.options.generation, self.documents, self.health)
        kept: dict[str, int] = {}
        if self.unread:
            # After the documents: a big file's earlier batches made its version a member.
            kept = self.writer.keep_published(self.options.generation, self.unread, self.partial)
        for row in self.files:
            if row["key"] in kept:
                row["version"] = kept[row["key"]]  # the published version still served
            self.rows.add(**row)
        self.documents, self.health, self.files, self.records = [], [], [], 0
        self.unread, self.partial = [], []


@dataclass
class _DocumentWriter:
    """Collects one document version's records as the splitter produces them. A document of
    more than ``write_batch`` records is written in batches while it streams; the rest goes
    to the read task's shared batch once the whole file has been checked."""

    writer: KnowledgeWriter | DryRunWriter
    options: IngestOptions
    source: SourceVersion
    rows: _Rows
    passages: list[SplitPassage] = field(default_factory=list)
    sections: list[SplitSection] = field(default_factory=list)
    n_passages: int = 0
    n_sections: int = 0

    def add(self, records: Iterable[SplitSection | SplitPassage]) -> None:
        for record in records:
            if isinstance(record, SplitPassage):
                self.passages.append(record)
                self.n_passages += 1
            else:
                self.n_sections += 1
                if self.options.embed:
                    self._section_row(record)
                else:
                    self.sections.append(record)
            if len(self.passages) + len(self.sections) >= self.options.write_batch:
                self.flush()

    def _section_row(self, s: SplitSection) -> None:
        self.rows.add(
            kind="section",
            key=self.source.path,
            source_id=str(self.source.source_id),
            version=self.source.version,
            ordinal=s.ordinal,
            heading_path=list(s.heading_path),
            line_start=s.span.line_start,
            line_end=s.span.line_end,
            byte_start=s.span.byte_start,
            byte_end=s.span.byte_end,
            summary=s.summary_text,
        )

    def flush(self) -> None:
        self.writer.write_documents(
            self.options.generation, [(self.source, self.sections, self.passages)]
        )
        self.passages, self.sections = [], []

    def finish(self, batch: _Batch) -> None:
        # Also a document with no records (e.g. only blank lines): still a member.
        batch.add_document(self.source, self.sections, self.passages)
        self.passages, self.sections = [], []


def ingest_unit(files: Sequence[ListedFile], options: IngestOptions) -> Iterator[pa.Table]:
    """Check, register, split and write a unit of files; yields blocks of ROW_SCHEMA rows.

    Per-unit work instead of per-file work: every file is checked first, the checked ones are
    registered in one transaction (and the unchanged ones carried forward in one more), and
    the split documents are written with their health events in transactions of about
    ``write_batch`` records.
    """
    gen = options.generation
    rows = _Rows()
    writer = KnowledgeWriter(options.dsn) if options.dsn else DryRunWriter()
    with writer:
        batch = _Batch(writer, options, rows)
        scans = [
            (
                f,
                scan_file(
                    f.path, chunk_bytes=options.chunk_bytes, max_line_bytes=options.max_line_bytes
                ),
            )
            for f in files
        ]
        checked: dict[str, ScanResult] = {}
        outcomes: dict[int, _FileOutcome] = {}
        for i, (f, scan) in enumerate(scans):
            if scan.skip is not None and scan.skip.is_read_failure:
                outcomes[i] = _FileOutcome(
                    "failed", f"{scan.skip.value}: {scan.detail}", keep_published=True
                )
            elif scan.skip is not None:
                outcomes[i] = _FileOutcome("skipped", scan.skip.value)
            elif f.key in checked:
                # Two PATHs can give the same registry path (same folder name twice).
                outcomes[i] = _FileOutcome("failed", f"duplicate registry path {f.key!r}")
            else:
                checked[f.key] = scan
        registered = writer.register_sources(
            gen.org_id, gen.collection, [(key, s.sha256, s.size) for key, s in checked.items()]
        )
        sources = {source.path: source for source in registered}
        writer.carry_forward_sources(gen, [s.source_id for s in registered if s.unchanged])
        for i, (f, scan) in enumerate(scans):
            outcome = outcomes.get(i)
            if outcome is None:
                source = sources[f.key]
                if source.unchanged:
                    outcome = _FileOutcome("unchanged")
                else:
                    outcome = yield from _split_file(f, scan, source, options, batch, rows)
            batch.file_done(f, outcome)
            if len(rows) >= _ROWS_PER_BLOCK:
                yield rows.take()
        batch.flush()
    if len(rows):
        yield rows.take()


_ROWS_PER_BLOCK = 256


def _split_file(
    f: ListedFile,
    scan: ScanResult,
    source: SourceVersion,
    options: IngestOptions,
    batch: _Batch,
    rows: _Rows,
) -> Generator[pa.Table, None, _FileOutcome]:
    """Split one checked file; yields blocks while a big file streams, returns its outcome."""
    assert scan.fmt is not None
    doc = _DocumentWriter(batch.writer, options, source, rows)
    splitter = Splitter(
        scan.fmt, max_passage_bytes=options.max_passage_bytes, max_line_bytes=options.max_line_bytes
    )
    digest = hashlib.sha256()
    unreported = 0
    try:
        for chunk in read_chunks(f.path, options.chunk_bytes):
            digest.update(chunk)
            doc.add(splitter.feed(chunk))
            unreported += len(chunk)
            if unreported >= options.progress_bytes:
                rows.add(kind="progress", key=f.key, bytes=unreported)
                unreported = 0
                yield rows.take()  # the driver sees progress; Ray Data may apply backpressure
            elif len(rows) >= _ROWS_PER_BLOCK:
                yield rows.take()
        doc.add(splitter.finish())
    except (OSError, LineTooLongError) as exc:
        return _FileOutcome(
            "failed", f"{SkipReason.UNREADABLE.value}: {exc}", keep_published=True, source=source
        )
    if digest.hexdigest() != scan.sha256:
        # What was split is not the content registered under this version.
        return _FileOutcome(
            "failed", "changed while being read", keep_published=True, source=source
        )
    doc.finish(batch)
    return _FileOutcome("written", "", doc.n_sections, doc.n_passages, written=source)


class DryRunWriter:
    """Stands in for ``KnowledgeWriter`` in a dry run: every source is new, nothing is kept."""

    def __enter__(self) -> DryRunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def register_sources(
        self, org_id: str, collection: str, files: Sequence[SourceFile]
    ) -> list[SourceVersion]:
        return [
            SourceVersion(
                org_id=org_id,
                collection=collection,
                path=path,
                source_id=uuid.UUID(int=0),
                version=1,
                unchanged=False,
            )
            for path, _, _ in files
        ]

    def carry_forward_sources(
        self, generation: Generation, source_ids: Sequence[uuid.UUID]
    ) -> None:
        pass

    def write_documents(
        self,
        generation: Generation,
        documents: Sequence[Document],
        health: Sequence[HealthRecord] = (),
    ) -> int:
        return sum(len(passages) for _, _, passages in documents)

    def keep_published(
        self, generation: Generation, paths: Sequence[str], failed: Sequence[SourceVersion] = ()
    ) -> dict[str, int]:
        return {}


def plan_units(
    files: Iterable[ListedFile], unit_bytes: int = 8 << 20, unit_files: int = 1024
) -> list[list[ListedFile]]:
    """Group files into read-task units: small files together (≤ ``unit_bytes`` and
    ``unit_files``), every file larger than ``unit_bytes`` alone (it streams).

    Each read task costs ~0.1 s beyond its work (scheduling, a connection, the registry
    transaction: 35 units of ≤ 256 files made the Documentation/ benchmark's pipeline 2.7 s
    slower on 2 CPUs than 9 units of ≤ 1,024), and too few units leave CPUs idle at the end
    (5 units: 0.7 s slower than 9); ``unit_size`` picks ``unit_bytes`` between the two.
    """
    units: list[list[ListedFile]] = []
    current: list[ListedFile] = []
    size = 0
    for f in files:
        if f.size > unit_bytes:
            units.append([f])
            continue
        if current and (size + f.size > unit_bytes or len(current) >= unit_files):
            units.append(current)
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        units.append(current)
    # Biggest units first: a long single-file task starts early instead of ending last.
    units.sort(key=lambda unit: -sum(f.size for f in unit))
    return units


def unit_size(total_bytes: int, cpus: float, *, per_cpu: int = 4) -> int:
    """``unit_bytes`` for a corpus of ``total_bytes`` on ``cpus``: about ``per_cpu`` units per
    CPU so that the last ones finish together, within [1 MiB, 8 MiB] (bounded memory and
    per-task overhead)."""
    share = total_bytes // max(1, round(per_cpu * cpus))
    return min(8 << 20, max(1 << 20, share))


class SourceFilesDatasource(Datasource):
    """A Ray Data datasource over planned units of files; see the module docstring."""

    def __init__(self, units: list[list[ListedFile]], options: IngestOptions) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._units = units
        self._options = options

    def get_name(self) -> str:
        return "SourceFiles"

    def estimate_inmemory_data_size(self) -> int | None:
        # The output is small rows, not the files' bytes.
        return 256 * sum(len(unit) for unit in self._units)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        # The units are planned by size already; ``parallelism`` does not apply.
        options = self._options
        tasks = []
        for unit in self._units:
            metadata = BlockMetadata(
                num_rows=None,
                size_bytes=256 * len(unit),
                input_files=tuple(f.path for f in unit),
                exec_stats=None,
            )
            tasks.append(ReadTask(_read_fn(unit, options), metadata, schema=ROW_SCHEMA))
        return tasks


def _read_fn(unit: list[ListedFile], options: IngestOptions) -> Any:
    def read() -> Iterator[pa.Table]:
        task_tracing(options.traceparent, options.dsn)
        span = start_child_span(
            "ingest unit",
            options.traceparent,
            {
                "cortex.org_id": options.generation.org_id,
                "cortex.collection": options.generation.collection,
                "cortex.files": len(unit),
                "cortex.bytes": sum(f.size for f in unit),
            },
        )
        rows = 0
        try:
            for table in ingest_unit(unit, options):
                rows += table.num_rows
                yield table
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            raise
        finally:
            span.set_attribute("cortex.rows", rows)
            span.end()

    return read


_EMBED_SLICE = 16


class SectionWriter:
    """Ray Data actor UDF: embeds section summaries and writes the sections with vectors.

    One per actor process: the model loads once (a few seconds) and the connection stays open.
    Rows that are not sections pass through unchanged.
    """

    def __init__(self, dsn: str, generation: Generation, traceparent: str | None = None) -> None:
        from cortex_ray.models import SentenceTransformerEmbedder

        task_tracing(traceparent, dsn)
        self._embedder = SentenceTransformerEmbedder()
        self._writer = KnowledgeWriter(dsn)
        self._generation = generation
        self._traceparent = traceparent

    def __call__(self, batch: pa.Table) -> pa.Table:
        kinds = batch.column("kind").to_pylist()
        if "section" not in kinds:
            return batch
        with server_span(
            "embed sections",
            self._traceparent,
            {
                "cortex.org_id": self._generation.org_id,
                "cortex.collection": self._generation.collection,
                "cortex.sections": kinds.count("section"),
            },
        ):
            return self._write(batch, kinds)

    def _write(self, batch: pa.Table, kinds: list[str]) -> pa.Table:
        data = batch.to_pydict()
        indices = [i for i, kind in enumerate(kinds) if kind == "section"]
        texts = [data["summary"][i] for i in indices]
        # Small slices: a transformer's attention scores grow with batch × length², and
        # summaries are long (~256 tokens); 16 at a time keeps the actor ~300 MB smaller
        # than the embedder's default batch of 64 (measured in one process: peak PSS 685 MB
        # against 964 MB for 256 summaries; the speed on CPU was the same within noise).
        vectors = np.concatenate(
            [
                self._embedder.embed_sync(texts[i : i + _EMBED_SLICE])
                for i in range(0, len(texts), _EMBED_SLICE)
            ]
        )
        by_source: dict[tuple[str, int], list[int]] = {}
        for row, i in enumerate(indices):
            by_source.setdefault((data["source_id"][i], data["version"][i]), []).append(row)
        gen = self._generation
        for (source_id, version), members in by_source.items():
            first = indices[members[0]]
            source = SourceVersion(
                org_id=gen.org_id,
                collection=gen.collection,
                path=data["key"][first],
                source_id=source_id,  # type: ignore[arg-type]  # pydantic parses the UUID
                version=version,
                unchanged=False,
            )
            sections = [
                SplitSection(
                    ordinal=data["ordinal"][indices[m]],
                    heading_path=tuple(data["heading_path"][indices[m]]),
                    span=Span(
                        data["line_start"][indices[m]],
                        data["line_end"][indices[m]],
                        data["byte_start"][indices[m]],
                        data["byte_end"][indices[m]],
                    ),
                    summary_text=data["summary"][indices[m]],
                )
                for m in members
            ]
            self._writer.write_sections(gen, source, sections, vectors[members])
        keep = [i for i, kind in enumerate(kinds) if kind != "section"]
        return batch.take(pa.array(keep, type=pa.int64()))


def extract_graph(
    batch: pa.Table, *, dsn: str, org_id: str, run_id: int, traceparent: str | None = None
) -> pa.Table:
    """Ray Data task UDF: the context graph's deterministic extraction, after a version is
    written. For each ``file`` row of a written version it reads the file again, checks its
    content hash against the version's and writes the facts it finds (``GraphWriter``);
    one ``graph`` row per file reports the outcome and the number of facts found.

    A task, not an actor: it needs no model, so it runs in the read tasks' warm worker
    processes (an actor would start a process per job: seconds, on a small job more than
    the extraction) and on as many CPUs as the blocks allow."""
    from cortex_ray.graph import GraphWriter

    data = batch.to_pydict()
    todo = [
        i
        for i, kind in enumerate(data["kind"])
        if kind == "file" and data["status"][i] == "written" and data["path"][i]
    ]
    if not todo:
        return batch
    task_tracing(traceparent, dsn)
    rows = _Rows()
    with (
        server_span(
            "extract graph", traceparent, {"cortex.org_id": org_id, "cortex.files": len(todo)}
        ),
        GraphWriter(dsn) as writer,
    ):
        # One transaction for the block's files (a file's own would cost more than its
        # extraction: most files hold a few facts).
        outcomes = writer.extract_sources(
            org_id,
            run_id,
            [(data["source_id"][i], data["version"][i], data["path"][i]) for i in todo],
        )
    for i, got in zip(todo, outcomes, strict=True):
        rows.add(
            kind="graph",
            key=data["key"][i],
            status=got.status,
            reason=got.detail,
            assertions=got.assertions,
        )
    return pa.concat_tables([batch, rows.take()])
