"""PERCEIVE: the working-memory assembler and the one prompt composer."""

from cortex_ray.perceive._assembler import WorkingMemoryAssembler
from cortex_ray.perceive._composer import (
    MEMORY_CHARS,
    PromptComposer,
    call_text,
    is_answer_part,
    objective_parts,
    repeat_of,
)
from cortex_ray.perceive._tool_retrieval import (
    ToolIndex,
    ToolRetriever,
    always_shown,
    shown_note,
    tool_document,
)

__all__ = [
    "MEMORY_CHARS",
    "PromptComposer",
    "ToolIndex",
    "ToolRetriever",
    "WorkingMemoryAssembler",
    "always_shown",
    "call_text",
    "is_answer_part",
    "objective_parts",
    "repeat_of",
    "shown_note",
    "tool_document",
]
