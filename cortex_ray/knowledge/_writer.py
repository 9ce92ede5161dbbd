"""The bulk writer that ingestion jobs use: synchronous (Ray Data UDFs are), one connection.

``KnowledgeWriter`` is one object made of the parts that each hold one job of the protocol:

=====================  ================================================================
``_connection.py``     the connection, cached lookups, the checks before a write
``_generations.py``    generations, membership, ``keep_published``, publish, garbage
``_sources.py``        the source registry, versions, health, ``mark_disappeared``
``_passages.py``       sections, passages and postings (the COPY paths, the stage)
``_vectors.py``        passage vectors computed elsewhere (the backfill)
``_sql.py``            the SQL this writer shares with ``KnowledgeService``
=====================  ================================================================

Each part is a class on the one base, so they share the connection and its caches; where a
part needs another's write inside its own transaction (a membership row, health events) it
calls that module's function (``include_members``, ``record_events``), not a method.

The publication protocol (docs/knowledge.md):

1. ``begin_generation`` opens a BUILDING generation of a collection.
2. For each source file: ``register_source`` (stable id per path, a version per content
   hash). An unchanged source is ``carry_forward``-ed: one membership row, no rewrite.
   A changed one gets ``write_sections`` / ``write_passages`` (any number of calls, from any
   number of processes; a retried batch writes nothing twice). Jobs use the bulk forms, which
   do per-batch work instead of per-file work: ``register_sources`` (one transaction for many
   files), ``carry_forward_sources``, and ``write_documents`` (the sections, passages,
   postings and health events of many documents in one transaction). ``write_documents`` is
   ``prepare_documents`` (the client-side work: tokens, COPY text under reserved passage ids)
   then ``write_prepared`` (the transaction), so a job can prepare one batch while another
   connection writes the previous one.
3. ``mark_disappeared`` records the sources that were not seen this run.
4. ``publish`` computes the generation's BM25 statistics from the previous publication's
   plus the difference in membership, and swaps the collection's pointer in one
   transaction. Until then searches serve the previous publication; a run that dies before
   publishing leaves it serving, and its rows are reused by a rerun (same content hash → same
   version → same passage keys) or removed by ``collect_garbage``.
"""

from __future__ import annotations

from cortex_ray.knowledge._generations import GenerationWriter
from cortex_ray.knowledge._passages import PassageWriter
from cortex_ray.knowledge._sources import SourceWriter
from cortex_ray.knowledge._vectors import VectorWriter

__all__ = ["KnowledgeWriter"]


class KnowledgeWriter(GenerationWriter, SourceWriter, PassageWriter, VectorWriter):
    """Writes generations of a collection. Not thread-safe: one per worker process.

    Args:
        dsn: the PostgreSQL connection string; the writer connects on first use.
    """
