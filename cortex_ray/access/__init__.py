"""Access control: principals, grants and the one decision every tool call goes through."""

from cortex_ray.access._service import AccessControlService, AccessDecision

__all__ = ["AccessControlService", "AccessDecision"]
