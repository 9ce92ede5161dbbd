"""Test helpers for the knowledge store: a tiny markdown splitter and a one-call ingest.

The splitter is deliberately independent of ``cortex_ray.knowledge._split``'s streaming
splitter: the store's tests build the agreed records themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from cortex_ray.knowledge import (
    Generation,
    KnowledgeWriter,
    PublishReport,
    SourceVersion,
    Span,
    SplitPassage,
    SplitSection,
)
from cortex_ray.models import HashEmbedder


def split_markdown(data: bytes) -> tuple[list[SplitSection], list[SplitPassage]]:
    """Sections at ``#`` headings, passages at blank lines; exact line and byte ranges."""
    lines = data.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    sections: list[SplitSection] = []
    passages: list[SplitPassage] = []
    headings: list[str] = []
    section_start = 0  # line index
    para: list[int] = []

    def flush_para() -> None:
        if not para:
            return
        start, end = para[0], para[-1]
        text = data[offsets[start] : offsets[end + 1]].decode()
        passages.append(
            SplitPassage(
                ordinal=len(passages),
                section_ordinal=len(sections),
                text=text,
                span=Span(start + 1, end + 1, offsets[start], offsets[end + 1]),
            )
        )
        para.clear()

    def flush_section(end: int) -> None:
        if end <= section_start:
            return
        body = data[offsets[section_start] : offsets[end]].decode()
        sections.append(
            SplitSection(
                ordinal=len(sections),
                heading_path=tuple(headings),
                span=Span(section_start + 1, end, offsets[section_start], offsets[end]),
                summary_text=(" › ".join(headings) + "\n" + body)[:1000],
            )
        )

    for i, raw in enumerate(lines):
        line = raw.decode().rstrip("\n")
        if line.startswith("#"):
            flush_para()
            flush_section(i)
            level = len(line) - len(line.lstrip("#"))
            headings[:] = [*headings[: level - 1], line.lstrip("#").strip()]
            section_start = i
        elif not line.strip():
            flush_para()
        else:
            para.append(i)
    flush_para()
    flush_section(len(lines))
    return sections, passages


@dataclass
class Ingest:
    generation: Generation
    sources: dict[str, SourceVersion] = field(default_factory=dict)
    report: PublishReport | None = None


def ingest(
    writer: KnowledgeWriter,
    org: str,
    collection: str,
    files: Mapping[str, bytes],
    *,
    publish: bool = True,
    embedder: HashEmbedder | None = None,
) -> Ingest:
    """One ingestion run the way a job drives the writer."""
    embedder = embedder or HashEmbedder(384)
    gen = writer.begin_generation(org, collection)
    run = Ingest(gen)
    for path, data in files.items():
        source = writer.register_source(
            org, collection, path, hashlib.sha256(data).hexdigest(), len(data)
        )
        run.sources[path] = source
        writer.record_health(org, collection, path, "READ_OK", "")
        if source.unchanged:
            writer.carry_forward(gen, source.source_id)
            continue
        sections, passages = split_markdown(data)
        vectors = (
            embedder.embed_sync([s.summary_text for s in sections])
            if sections
            else np.zeros((0, 384), np.float32)
        )
        writer.write_passages(gen, source, passages)
        writer.write_sections(gen, source, sections, vectors)
    writer.mark_disappeared(gen, list(files))
    if publish:
        run.report = writer.publish(gen)
    return run
