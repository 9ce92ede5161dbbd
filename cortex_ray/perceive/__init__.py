"""PERCEIVE: the working-memory assembler and the one prompt composer."""

from cortex_ray.perceive._assembler import WorkingMemoryAssembler
from cortex_ray.perceive._composer import PromptComposer

__all__ = ["PromptComposer", "WorkingMemoryAssembler"]
