"""Governed actions (issue 18): connectors and their grants, decided in the one invocation
gate (``cortex_ray.act``), and the use cases that manage them."""

from cortex_ray.governance._discovery import CONNECTOR_ENTRY_POINTS, discover_connectors
from cortex_ray.governance._policy import (
    REDACTED,
    ConnectorPolicy,
    check_constraints,
    redact,
    redact_values,
)
from cortex_ray.governance._schedules import Schedule, ScheduleStatus, ScheduleStore
from cortex_ray.governance._secrets import (
    Rotation,
    SecretInfo,
    SecretStore,
    load_previous_keys,
    load_secret_key,
)
from cortex_ray.governance._store import GovernanceStore
from cortex_ray.governance._types import (
    Approval,
    ApprovalPolicy,
    ApprovalStatus,
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    GrantRequest,
    HealthProbe,
    ReportedCall,
    RunLabel,
    RunLabelRecord,
    RunReport,
    ShadowAcceptance,
    Verdict,
)
from cortex_ray.governance._use_cases import ConnectorView, Governance

__all__ = [
    "CONNECTOR_ENTRY_POINTS",
    "REDACTED",
    "Approval",
    "ApprovalPolicy",
    "ApprovalStatus",
    "Connector",
    "ConnectorGrant",
    "ConnectorInstance",
    "ConnectorPolicy",
    "ConnectorView",
    "Governance",
    "GovernanceStore",
    "GrantRequest",
    "HealthProbe",
    "ReportedCall",
    "Rotation",
    "RunLabel",
    "RunLabelRecord",
    "RunReport",
    "Schedule",
    "ScheduleStatus",
    "ScheduleStore",
    "SecretInfo",
    "SecretStore",
    "ShadowAcceptance",
    "Verdict",
    "check_constraints",
    "discover_connectors",
    "load_previous_keys",
    "load_secret_key",
    "redact",
    "redact_values",
]
