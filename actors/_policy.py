"""How session actors live: idle timeout, live cap, queue bound. One object, set by environment."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from actors._naming import NAMESPACE

__all__ = ["SessionPolicy"]


class SessionPolicy(BaseSettings):
    """Lifecycle settings of the session actors; every field reads ``CORTEX_ACTORS_<FIELD>``.

    The directory (the supervisor) takes the policy of the manager that created it: managers
    sharing a namespace should share a policy.
    """

    model_config = SettingsConfigDict(env_prefix="CORTEX_ACTORS_", extra="ignore", frozen=True)

    namespace: str = Field(default=NAMESPACE, min_length=1)
    idle_timeout_s: float = Field(
        default=300.0, gt=0, description="an idle session actor passivates after this long"
    )
    max_live_sessions: int = Field(
        default=256,
        ge=1,
        description="live session actors above this evict the least recently used idle ones",
    )
    max_pending_turns: int = Field(
        default=8,
        ge=1,
        description="turns one session holds (running + queued); one more → SessionBusyError",
    )
    reactivation_timeout_s: float = Field(
        default=15.0, gt=0, description="how long a call waits for a passivating actor to go"
    )
    run_retry_limit: int = Field(
        default=5,
        ge=0,
        description="consecutive failed attempts to drive a run before the directory stops",
    )
