"""Knowledge: collections of sources split into sections and passages, published in
generations, searched by BM25 (in PostgreSQL) and pgvector, fused, cited by exact range."""

from cortex_ray.knowledge._bm25 import BM25_B, BM25_K1, STOPWORDS, query_terms, tokenize
from cortex_ray.knowledge._read import (
    ListedFile,
    ScanResult,
    SkipReason,
    detect_format,
    list_files,
    read_chunks,
    scan_file,
)
from cortex_ray.knowledge._service import (
    KnowledgeService,
    Publication,
    citation,
    fuse,
)
from cortex_ray.knowledge._split import (
    Format,
    LineTooLongError,
    Span,
    SplitPassage,
    SplitSection,
    Splitter,
    split_bytes,
    split_stream,
)
from cortex_ray.knowledge._tool import knowledge_search_tool
from cortex_ray.knowledge._types import (
    Fusion,
    GarbageReport,
    Generation,
    HealthEvent,
    PublishReport,
    RetrievalConfig,
    SearchHit,
    SearchResult,
    SourceVersion,
    Tier,
)
from cortex_ray.knowledge._writer import DIM as VECTOR_DIM
from cortex_ray.knowledge._writer import KnowledgeWriter

__all__ = [
    "BM25_B",
    "BM25_K1",
    "STOPWORDS",
    "VECTOR_DIM",
    "Format",
    "Fusion",
    "GarbageReport",
    "Generation",
    "HealthEvent",
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
    "SourceVersion",
    "Span",
    "SplitPassage",
    "SplitSection",
    "Splitter",
    "Tier",
    "citation",
    "detect_format",
    "fuse",
    "knowledge_search_tool",
    "list_files",
    "query_terms",
    "read_chunks",
    "scan_file",
    "split_bytes",
    "split_stream",
    "tokenize",
]
