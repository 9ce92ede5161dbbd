"""The context graph: entities and relationship assertions with provenance (source, version,
evidence span, extractor, confidence) and two time axes, recorded in PostgreSQL; graph
search within budgets; a projection into Neo4j fed from an outbox (docs/graph.md).

Every name another package needs is here: the ingestion job (``GraphWriter``), the runtime
(``GraphStore``, the ``graph_search`` tool) and the projection job (``Projector``). The
modules behind it are private.
"""

from cortex_ray.graph._extract import (
    EXTRACTOR_VERSION,
    Mention,
    extract_mentions,
    facts_from_mentions,
)
from cortex_ray.graph._extract_options import (
    EXTRACT_JOB,
    ExtractActors,
    ExtractAddress,
    ExtractBatch,
    ExtractCollection,
    ExtractDatabaseUrl,
    ExtractInFlight,
    ExtractModelVersion,
    ExtractNumGpus,
    ExtractOrg,
    ExtractRequest,
    ExtractSinceVersion,
    ExtractSources,
    setting_shown,
)
from cortex_ray.graph._model_extract import (
    MODEL,
    PROMPT_VERSION,
    BatchOutcome,
    ModelFact,
    Passage,
    PublishedVersion,
    extract_batch,
    locate,
    model_method_version,
    plan_batches,
)
from cortex_ray.graph._projection import ProjectionReport, Projector, open_driver
from cortex_ray.graph._store import GraphStore, Reader
from cortex_ray.graph._tool import graph_search_tool, render_fact
from cortex_ray.graph._types import (
    Entity,
    Evidence,
    ExtractionRun,
    Fact,
    GraphResult,
    SubmitReport,
    Triple,
)
from cortex_ray.graph._writer import DETERMINISTIC, GraphWriter, SourceExtraction

# Source health lives with the sources (cortex_ray.knowledge); the graph's facts carry it,
# and the runtime reaches it here with the rest of issue 19.
from cortex_ray.knowledge import (
    SourceHealthMonitor,
    SourceHealthReport,
    readable_scope,
    source_warnings,
)

__all__ = [
    "DETERMINISTIC",
    "EXTRACTOR_VERSION",
    "EXTRACT_JOB",
    "MODEL",
    "PROMPT_VERSION",
    "BatchOutcome",
    "Entity",
    "Evidence",
    "ExtractActors",
    "ExtractAddress",
    "ExtractBatch",
    "ExtractCollection",
    "ExtractDatabaseUrl",
    "ExtractInFlight",
    "ExtractModelVersion",
    "ExtractNumGpus",
    "ExtractOrg",
    "ExtractRequest",
    "ExtractSinceVersion",
    "ExtractSources",
    "ExtractionRun",
    "Fact",
    "GraphResult",
    "GraphStore",
    "GraphWriter",
    "Mention",
    "ModelFact",
    "Passage",
    "ProjectionReport",
    "Projector",
    "PublishedVersion",
    "Reader",
    "SourceExtraction",
    "SourceHealthMonitor",
    "SourceHealthReport",
    "SubmitReport",
    "Triple",
    "extract_batch",
    "extract_mentions",
    "facts_from_mentions",
    "graph_search_tool",
    "locate",
    "model_method_version",
    "open_driver",
    "plan_batches",
    "readable_scope",
    "render_fact",
    "setting_shown",
    "source_warnings",
]
