"""Governed actions (issue 18): connectors and their grants, decided in the one invocation
gate (``cortex_ray.act``), and the use cases that manage them."""

from cortex_ray.governance._policy import REDACTED, ConnectorPolicy, check_constraints, redact
from cortex_ray.governance._store import GovernanceStore
from cortex_ray.governance._types import (
    ApprovalPolicy,
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    GrantRequest,
    HealthProbe,
    Verdict,
)

__all__ = [
    "REDACTED",
    "ApprovalPolicy",
    "Connector",
    "ConnectorGrant",
    "ConnectorInstance",
    "ConnectorPolicy",
    "GovernanceStore",
    "GrantRequest",
    "HealthProbe",
    "Verdict",
    "check_constraints",
    "redact",
]
