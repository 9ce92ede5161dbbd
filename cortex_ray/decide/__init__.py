"""DECIDE: the only seam that differs between interactive and autonomous agents."""

from cortex_ray.decide._autonomous import NO_MODEL_REASON, AutonomousDriver
from cortex_ray.decide._critic import Critic, Review
from cortex_ray.decide._interactive import InteractiveDriver

__all__ = ["NO_MODEL_REASON", "AutonomousDriver", "Critic", "InteractiveDriver", "Review"]
