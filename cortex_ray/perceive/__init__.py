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

__all__ = [
    "MEMORY_CHARS",
    "PromptComposer",
    "WorkingMemoryAssembler",
    "call_text",
    "is_answer_part",
    "objective_parts",
    "repeat_of",
]
