"""CoALA's long-term memory: episodic, semantic and procedural, bitemporal, in PostgreSQL.

``MemoryService`` is the one way in: LEARN writes through it (``prepare`` outside the
transaction, ``write_prepared`` inside the cycle's), PERCEIVE reads it once per cycle
(``snapshot``), and procedural edits go through ``propose_edit``/``decide_proposal``.
See ``cortex_ray.memory._service`` for the bitemporal model and the parts that compose the
service, and ``cortex_ray.memory._recall`` for the recall score.
"""

from cortex_ray._types import EMBEDDING_DIM
from cortex_ray.memory._extraction import normalise_subject
from cortex_ray.memory._importance import (
    HeuristicImportanceScorer,
    ImportanceScorer,
    ModelImportanceScorer,
    importance_scorer_for,
)
from cortex_ray.memory._prepare import PreparedMemory
from cortex_ray.memory._service import MemoryService

__all__ = [
    "EMBEDDING_DIM",
    "HeuristicImportanceScorer",
    "ImportanceScorer",
    "MemoryService",
    "ModelImportanceScorer",
    "PreparedMemory",
    "importance_scorer_for",
    "normalise_subject",
]
