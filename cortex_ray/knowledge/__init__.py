"""Knowledge: collections of sources split into sections and passages, published in
generations, searched by BM25 (in PostgreSQL) and pgvector, fused, cited by exact range.

Every name another package needs is here: the ingestion and backfill jobs (the reader, the
splitter, ``KnowledgeWriter`` and the records it takes), the runtime (``KnowledgeService``,
the tool) and the benchmarks (BM25's formula, pgvector's text form). The modules behind it
are private.
"""

from cortex_ray.knowledge._bm25 import (
    BM25_B,
    BM25_K1,
    PLAIN,
    STOPWORDS,
    Analyzer,
    idf,
    query_terms,
    term_counts,
    tf_factor,
    tokenize,
)
from cortex_ray.knowledge._health import (
    WARNING_KINDS,
    FindingKind,
    HealthFinding,
    HealthSweeper,
    SourceHealthMonitor,
    SourceHealthReport,
)
from cortex_ray.knowledge._read import (
    ListedFile,
    ScanResult,
    SkipReason,
    detect_format,
    list_files,
    read_chunks,
    scan_file,
)
from cortex_ray.knowledge._reading import (
    denied_collections,
    readable_scope,
    source_warnings,
    warning_text,
)
from cortex_ray.knowledge._service import (
    KnowledgeService,
    Publication,
    citation,
    fuse,
)
from cortex_ray.knowledge._split import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_PASSAGE_BYTES,
    Format,
    LineTooLongError,
    Span,
    SplitPassage,
    SplitSection,
    Splitter,
    split_bytes,
    split_stream,
)
from cortex_ray.knowledge._sql import DIM as VECTOR_DIM
from cortex_ray.knowledge._sql import vector_literal
from cortex_ray.knowledge._tool import knowledge_search_tool
from cortex_ray.knowledge._types import (
    Document,
    Fusion,
    GarbageReport,
    Generation,
    HealthEvent,
    HealthRecord,
    PublishReport,
    RetrievalConfig,
    SearchHit,
    SearchResult,
    SourceFile,
    SourceVersion,
    Tier,
)
from cortex_ray.knowledge._writer import KnowledgeWriter

__all__ = [
    "BM25_B",
    "BM25_K1",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_PASSAGE_BYTES",
    "PLAIN",
    "STOPWORDS",
    "VECTOR_DIM",
    "WARNING_KINDS",
    "Analyzer",
    "Document",
    "FindingKind",
    "Format",
    "Fusion",
    "GarbageReport",
    "Generation",
    "HealthEvent",
    "HealthFinding",
    "HealthRecord",
    "HealthSweeper",
    "KnowledgeService",
    "KnowledgeWriter",
    "LineTooLongError",
    "ListedFile",
    "Publication",
    "PublishReport",
    "RetrievalConfig",
    "ScanResult",
    "SearchHit",
    "SearchResult",
    "SkipReason",
    "SourceFile",
    "SourceHealthMonitor",
    "SourceHealthReport",
    "SourceVersion",
    "Span",
    "SplitPassage",
    "SplitSection",
    "Splitter",
    "Tier",
    "citation",
    "denied_collections",
    "detect_format",
    "fuse",
    "idf",
    "knowledge_search_tool",
    "list_files",
    "query_terms",
    "read_chunks",
    "readable_scope",
    "scan_file",
    "source_warnings",
    "split_bytes",
    "split_stream",
    "term_counts",
    "tf_factor",
    "tokenize",
    "vector_literal",
    "warning_text",
]
