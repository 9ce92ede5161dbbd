"""Access control: principals, grants, the one decision every tool call goes through, and
the one decision every use case of the runtime goes through."""

from cortex_ray.access._service import (
    DIALOGUE,
    AccessControlService,
    AccessDecision,
    Tier,
    UseCase,
    UseCaseRequest,
)

__all__ = [
    "DIALOGUE",
    "AccessControlService",
    "AccessDecision",
    "Tier",
    "UseCase",
    "UseCaseRequest",
]
