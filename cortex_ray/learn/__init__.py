"""LEARN: the cycle's writes of long-term memory, at their cadences (per step, per run, per
turn, after a session). The memories themselves live in ``cortex_ray.memory``."""

from cortex_ray.learn._learner import Learner, step_memory_text

__all__ = ["Learner", "step_memory_text"]
