"""Documents: the writer's part that stores a source version's sections, passages and their
BM25 postings.

``write_documents`` is the bulk path the ingestion job takes: ``prepare_documents`` does the
client-side work (tokens, the COPY text of passages and postings under passage ids reserved
from the table's sequence), then ``write_prepared`` writes it in one transaction (COPY; a
retried batch falls back to ``INSERT ... ON CONFLICT DO NOTHING``, postings only for the
passages it inserted). Postings go to the partitioned ``kb_postings`` when the collection has
its partition, otherwise to the collection's stage, which publish attaches
(docs/knowledge.md, "Bulk loads"). ``write_sections`` stores sections with their eager
vectors; ``write_passages`` is ``write_documents`` for one document.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import psycopg
from numpy.typing import NDArray

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.knowledge._bm25 import Analyzer, length_norm
from cortex_ray.knowledge._connection import WriterConnection
from cortex_ray.knowledge._generations import (
    generation_analyzer,
    include_member,
    include_members,
)
from cortex_ray.knowledge._sources import check_events, record_events
from cortex_ray.knowledge._split import SplitPassage, SplitSection
from cortex_ray.knowledge._sql import (
    DIM,
    PASSAGES_COPY,
    SyncConn,
    ensure_stage,
    partition_name,
    postings_copy,
    stage_name,
    vector_literal,
)
from cortex_ray.knowledge._types import Document, Generation, HealthRecord, SourceVersion

__all__ = ["PassageWriter", "PreparedDocuments"]

log = logging.getLogger("cortex_ray.knowledge")
_DEFAULT_AVGDL = 100.0


def _copy_escape(value: str) -> str:
    """``value`` as a field of COPY's text format."""
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


def _clean(text: str) -> str:
    # PostgreSQL text cannot hold NUL; a passage with one is from a binary file.
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


@dataclass
class PreparedDocuments:
    """A ``write_documents`` batch after its client-side work (``prepare_documents``): the
    rows, and the COPY text of the passages and postings under reserved passage ids."""

    generation: Generation
    members: dict[uuid.UUID, int]
    sections: list[tuple[SourceVersion, SplitSection, None]]
    owners: list[SourceVersion]
    passages: list[SplitPassage]
    texts: list[str]
    lengths: list[int]
    counts: dict[tuple[uuid.UUID, int], Counter[str]]
    avgdl: float
    health: list[HealthRecord]
    collection_id: int = 0
    postings_table: str = "kb_postings"  # or the collection's stage (see ``stage_name``)
    passages_copy: str = ""
    postings_copy: str = ""


def _copy_texts(prepared: PreparedDocuments, ids: Sequence[int]) -> tuple[str, str]:
    """The COPY text of the passages and of their postings, under ``ids``.

    Built as text rather than row by row with ``write_row`` (~5 µs a row, ~70 postings a
    passage): terms are ``\\w+``, or words joined by ``.`` and ``-`` (no tab, newline or
    backslash), and numbers need no escaping; only names and passage texts are escaped.
    """
    gen = prepared.generation
    org = _copy_escape(gen.org_id)
    col = _copy_escape(gen.collection)
    cid = prepared.collection_id
    passages: list[str] = []
    postings: list[str] = []
    for pid, source, p, text, length in zip(
        ids, prepared.owners, prepared.passages, prepared.texts, prepared.lengths, strict=True
    ):
        span = p.span
        passages.append(
            f"{org}\t{pid}\t{source.source_id}\t{source.version}\t{col}\t{cid}\t{p.ordinal}\t"
            f"{p.section_ordinal}\t{_copy_escape(text)}\t{span.line_start}\t{span.line_end}\t"
            f"{span.byte_start}\t{span.byte_end}\t{length}\n"
        )
        postings.extend(
            _posting_lines(
                f"{org}\t{cid}\t{pid}\t",
                prepared.counts[(source.source_id, p.ordinal)],
                length_norm(length, prepared.avgdl),
            )
        )
    return "".join(passages), "".join(postings)


def _posting_lines(head: str, counts: Counter[str], norm: float) -> Iterator[str]:
    """COPY lines of one passage's postings: ``head`` is ``org\\tcollection_id\\tpassage_id\\t``
    (the organisation escaped), ``norm`` the passage's BM25 length normalisation. Terms are
    ``\\w+`` or words joined by ``.`` and ``-``, and numbers need no escaping."""
    return (f"{head}{term}\t{tf}\t{tf / (tf + norm)!r}\n" for term, tf in counts.items())


class PassageWriter(WriterConnection):
    """Writes the sections, passages and postings of source versions into generations."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._passage_ids: str | None = None  # the sequence of kb_passages.id
        self._postings_tables: dict[int, str] = {}  # generation → where its postings go
        self._analyzers: dict[int, Analyzer] = {}  # generation → its BM25 analyzer

    def _analyzer(self, gen: Generation) -> Analyzer:
        """The analyzer recorded with the generation (read once per writer): the one its
        postings must be tokenised with, whoever began it."""
        analyzer = self._analyzers.get(gen.id)
        if analyzer is None:
            analyzer = self._analyzers[gen.id] = generation_analyzer(self.conn, gen)
        return analyzer

    def _postings_table(self, gen: Generation) -> str:
        """Where this writer COPYs the generation's postings, decided at its first write: the
        partitioned ``kb_postings`` when the collection has its partition (each posting then
        updates two indexes and is checked against its passage), otherwise the collection's
        stage, a table without indexes or foreign key that publishing attaches as the
        partition (the indexes then built by sorting, the key checked by one join)."""
        table = self._postings_tables.get(gen.id)
        if table is None:
            cid = self._collection_id(gen.org_id, gen.collection)
            row = self._one(
                "SELECT to_regclass(%s) IS NOT NULL AS attached", (partition_name(cid),)
            )
            if row is not None and row["attached"]:
                table = "kb_postings"
            else:
                ensure_stage(self.conn, cid)
                table = stage_name(cid)
            self._postings_tables[gen.id] = table
        return table

    def write_sections(
        self,
        generation: Generation | int,
        source: SourceVersion,
        sections: Sequence[SplitSection],
        section_vectors: NDArray[np.float32] | None = None,
    ) -> int:
        """Store a document's sections (and their eager vectors); returns the rows written.

        Idempotent per (source version, ordinal); writing a section again with a vector fills
        in a vector that was missing.
        """
        gen = self._generation(generation)
        self._check_source(gen, source)
        if section_vectors is not None and section_vectors.shape != (len(sections), DIM):
            raise InvalidRequestError(
                f"section_vectors must have shape ({len(sections)}, {DIM}), "
                f"not {section_vectors.shape}"
            )
        vectors: list[str | None] = (
            [vector_literal(v) for v in section_vectors]
            if section_vectors is not None
            else [None] * len(sections)
        )
        with self.conn.transaction():
            self._lock_building(self.conn, gen)
            include_member(self.conn, gen, source.source_id, source.version, carried=False)
            return self._insert_sections(
                self.conn, gen, [(source, s, v) for s, v in zip(sections, vectors, strict=True)]
            )

    @staticmethod
    def _insert_sections(
        conn: SyncConn,
        gen: Generation,
        rows: Sequence[tuple[SourceVersion, SplitSection, str | None]],
    ) -> int:
        # One row per (source version, ordinal): a merged retry may repeat one, and ON
        # CONFLICT DO UPDATE cannot touch a row twice in one statement.
        firsts: dict[tuple[uuid.UUID, int, int], tuple[SourceVersion, SplitSection, str | None]]
        firsts = {}
        for src, s, v in rows:
            firsts.setdefault((src.source_id, src.version, s.ordinal), (src, s, v))
        if not firsts:
            return 0
        kept = list(firsts.values())
        cur = conn.execute(
            """
            INSERT INTO kb_sections (org_id, source_id, version, collection, ordinal,
                heading_path, line_start, line_end, byte_start, byte_end, summary_text,
                embedding)
            SELECT %(org)s, t.src, t.ver, %(col)s, t.ordinal,
                   ARRAY(SELECT jsonb_array_elements_text(t.heading::jsonb)),
                   t.ls, t.le, t.bs, t.be, t.summary, t.vec::halfvec(384)
            FROM unnest(%(src)s::uuid[], %(ver)s::int[], %(ordinal)s::int[],
                        %(heading)s::text[], %(ls)s::int[], %(le)s::int[], %(bs)s::bigint[],
                        %(be)s::bigint[], %(summary)s::text[], %(vec)s::text[])
                 AS t(src, ver, ordinal, heading, ls, le, bs, be, summary, vec)
            ON CONFLICT (org_id, source_id, version, ordinal) DO UPDATE
               SET embedding = EXCLUDED.embedding
             WHERE kb_sections.embedding IS NULL AND EXCLUDED.embedding IS NOT NULL
            """,
            {
                "org": gen.org_id,
                "col": gen.collection,
                "src": [src.source_id for src, _, _ in kept],
                "ver": [src.version for src, _, _ in kept],
                "ordinal": [s.ordinal for _, s, _ in kept],
                "heading": [json.dumps(list(s.heading_path)) for _, s, _ in kept],
                "ls": [s.span.line_start for _, s, _ in kept],
                "le": [s.span.line_end for _, s, _ in kept],
                "bs": [s.span.byte_start for _, s, _ in kept],
                "be": [s.span.byte_end for _, s, _ in kept],
                "summary": [_clean(s.summary_text) for _, s, _ in kept],
                "vec": [v for _, _, v in kept],
            },
        )
        return cur.rowcount

    def _avgdl_estimate(self, gen: Generation, lengths: Sequence[int]) -> float:
        """The average passage length the impacts are computed with.

        The published generation's when there is one; before the first publication, the mean
        of the lengths this writer has seen (batches are thousands of passages, so workers
        agree closely). Impacts only order the candidates; scores use the exact statistics.
        """
        key = (gen.org_id, gen.collection)
        if key not in self._avgdl:
            row = self._one(
                """
                SELECT g.total_length::float8 / nullif(g.passages, 0) AS avgdl
                FROM kb_collections c JOIN kb_generations g
                  ON g.org_id = c.org_id AND g.id = c.published_generation
                WHERE c.org_id = %s AND c.name = %s
                """,
                key,
            )
            if row and row["avgdl"]:
                self._avgdl[key] = float(row["avgdl"])
            else:
                self._seen.setdefault(key, [0, 0])
        seen = self._seen.get(key)
        if seen is not None:
            seen[0] += len(lengths)
            seen[1] += sum(lengths)
            return seen[1] / seen[0] if seen[0] and seen[1] else _DEFAULT_AVGDL
        return self._avgdl[key]

    def write_passages(
        self, generation: Generation | int, source: SourceVersion, passages: Sequence[SplitPassage]
    ) -> int:
        """Store passages and their postings; returns how many were new.

        Idempotent per (source version, passage ordinal): a retried batch inserts nothing twice,
        and postings are written only for the passages this call inserted, in the same
        transaction.
        """
        return self.write_documents(generation, [(source, (), passages)])

    def write_documents(
        self,
        generation: Generation | int,
        documents: Sequence[Document],
        health: Sequence[HealthRecord] = (),
    ) -> int:
        """The sections (without vectors), passages and postings of many documents, and health
        events, in one transaction; returns how many passages were new.

        Every document's source becomes a member of ``generation`` (also one with no records).
        Idempotent like ``write_sections`` and ``write_passages``: a retried call inserts no
        passage or posting twice (health events, a log, are recorded again).
        ``prepare_documents`` + ``write_prepared`` are the same in two steps.
        """
        return self.write_prepared(self.prepare_documents(generation, documents, health))

    def prepare_documents(
        self,
        generation: Generation | int,
        documents: Sequence[Document],
        health: Sequence[HealthRecord] = (),
    ) -> PreparedDocuments:
        """The client-side work of ``write_documents``: tokenise the passages (with the
        generation's analyzer) and build the COPY text of passages and postings, under
        passage ids reserved from the table's sequence. Only the reservation touches the
        database (one small query; the analyzer is read once per writer), so a job can
        prepare the next batch while another connection writes this one (``write_prepared``).
        """
        gen = self._generation(generation)
        check_events(health)
        members: dict[uuid.UUID, int] = {}
        for source, _, _ in documents:
            self._check_source(gen, source)
            if members.setdefault(source.source_id, source.version) != source.version:
                raise InvalidRequestError(f"two versions of {source.path!r} in one call")
        analyzer = self._analyzer(gen)
        counts: dict[tuple[uuid.UUID, int], Counter[str]] = {}
        owners: list[SourceVersion] = []
        flat: list[SplitPassage] = []
        lengths: list[int] = []
        texts: list[str] = []
        for source, _, passages in documents:
            for p in passages:
                text = _clean(p.text)
                frequencies, length = analyzer.term_counts(text)
                counts[(source.source_id, p.ordinal)] = frequencies
                owners.append(source)
                flat.append(p)
                lengths.append(length)
                texts.append(text)
        avgdl = self._avgdl_estimate(gen, lengths) if flat else _DEFAULT_AVGDL
        prepared = PreparedDocuments(
            generation=gen,
            members=members,
            sections=[(source, s, None) for source, sections, _ in documents for s in sections],
            owners=owners,
            passages=flat,
            texts=texts,
            lengths=lengths,
            counts=counts,
            avgdl=avgdl,
            health=list(health),
        )
        if flat:
            prepared.collection_id = self._collection_id(gen.org_id, gen.collection)
            prepared.postings_table = self._postings_table(gen)
            ids = self._reserve_passage_ids(len(flat))
            prepared.passages_copy, prepared.postings_copy = _copy_texts(prepared, ids)
        return prepared

    def _reserve_passage_ids(self, n: int) -> list[int]:
        # Identity values taken ahead: unique whatever else inserts (gaps are harmless).
        if self._passage_ids is None:
            row = self._one("SELECT pg_get_serial_sequence('kb_passages', 'id') AS seq")
            assert row is not None
            self._passage_ids = str(row["seq"])
        rows = self.conn.execute(
            "SELECT nextval(%s::regclass) AS id FROM generate_series(1, %s)",
            (self._passage_ids, n),
        ).fetchall()
        return [r["id"] for r in rows]

    def write_prepared(self, prepared: PreparedDocuments) -> int:
        """Write what ``prepare_documents`` built, in one transaction; returns how many
        passages were new. Any writer may write it (e.g. one on another thread).

        The passages and their postings are COPYed under the reserved ids. If some of these
        passages exist already (a retried batch, or another task writing the same version),
        the COPY fails on the unique key and the batch is written again the careful way:
        ``INSERT ... ON CONFLICT DO NOTHING``, postings only for the passages inserted.
        """
        gen = prepared.generation
        if prepared.health:
            self._ensure_collection(gen.org_id, gen.collection)
        if prepared.passages:
            try:
                return self._write_prepared(prepared, fast=True)
            except psycopg.errors.UniqueViolation:
                log.info("generation %s: passages written before; inserting the new ones", gen.id)
        return self._write_prepared(prepared, fast=False)

    def _write_prepared(self, prepared: PreparedDocuments, *, fast: bool) -> int:
        gen = prepared.generation
        with self.conn.transaction():
            conn = self.conn
            self._lock_building(conn, gen)
            include_members(conn, gen, prepared.members, carried=False)
            self._insert_sections(conn, gen, prepared.sections)
            inserted = 0
            if prepared.passages and fast:
                with conn.cursor().copy(PASSAGES_COPY) as copy:
                    copy.write(prepared.passages_copy)
                with conn.cursor().copy(postings_copy(prepared.postings_table)) as copy:
                    copy.write(prepared.postings_copy)
                inserted = len(prepared.passages)
            elif prepared.passages:
                inserted = self._insert_passages(conn, prepared)
            if prepared.health:
                record_events(conn, gen.org_id, gen.collection, prepared.health)
        return inserted

    @staticmethod
    def _insert_passages(conn: SyncConn, prepared: PreparedDocuments) -> int:
        # Postings go only to the passages this statement inserted (a retry inserts none).
        gen, owners, passages = prepared.generation, prepared.owners, prepared.passages
        inserted = conn.execute(
            """
            INSERT INTO kb_passages (org_id, source_id, version, collection, collection_id,
                ordinal, section_ordinal, text, line_start, line_end, byte_start, byte_end,
                length)
            SELECT %(org)s, t.src, t.ver, %(col)s, %(cid)s, t.ordinal, t.section, t.text, t.ls,
                   t.le, t.bs, t.be, t.length
            FROM unnest(%(src)s::uuid[], %(ver)s::int[], %(ordinal)s::int[], %(section)s::int[],
                        %(text)s::text[], %(ls)s::int[], %(le)s::int[], %(bs)s::bigint[],
                        %(be)s::bigint[], %(length)s::int[])
                 AS t(src, ver, ordinal, section, text, ls, le, bs, be, length)
            ON CONFLICT (org_id, source_id, version, ordinal) DO NOTHING
            RETURNING id, source_id, ordinal, length
            """,
            {
                "org": gen.org_id,
                "col": gen.collection,
                "cid": prepared.collection_id,
                "src": [s.source_id for s in owners],
                "ver": [s.version for s in owners],
                "ordinal": [p.ordinal for p in passages],
                "section": [p.section_ordinal for p in passages],
                "text": prepared.texts,
                "ls": [p.span.line_start for p in passages],
                "le": [p.span.line_end for p in passages],
                "bs": [p.span.byte_start for p in passages],
                "be": [p.span.byte_end for p in passages],
                "length": prepared.lengths,
            },
        ).fetchall()
        if inserted:
            # The COPY text is built here rather than row by row with ``write_row`` (~5 µs a
            # row, ~70 rows a passage): terms are ``\w+`` or words joined by ``.`` and ``-``
            # (no tab, newline or backslash) and ints and floats need no escaping; only the
            # names are escaped.
            head = f"{_copy_escape(gen.org_id)}\t{prepared.collection_id}\t"
            with conn.cursor().copy(postings_copy(prepared.postings_table)) as copy:
                lines: list[str] = []
                for row in inserted:
                    lines.extend(
                        _posting_lines(
                            f"{head}{row['id']}\t",
                            prepared.counts[(row["source_id"], row["ordinal"])],
                            length_norm(row["length"], prepared.avgdl),
                        )
                    )
                    if len(lines) >= 20_000:
                        copy.write("".join(lines))
                        lines = []
                copy.write("".join(lines))
        return len(inserted)
