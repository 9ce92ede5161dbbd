"""How session and run actors are named: one name per organisation and id, in one namespace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from cortex_ray import SessionPolicy

__all__ = ["DIRECTORY_NAME", "NAMESPACE", "ActorKey"]

NAMESPACE = SessionPolicy.model_fields["namespace"].default
"""The Ray namespace cortex-ray's actors live in by default (``SessionPolicy.namespace``)."""

DIRECTORY_NAME = "cortex-ray:directory"
"""The supervisor's name; no actor key can take it (keys always hold two slashes)."""

Kind = Literal["run", "session"]


@dataclass(frozen=True, slots=True)
class ActorKey:
    """Which actor: ``{org}/run/{id}`` drives one task run, ``{org}/session/{id}`` one session."""

    kind: Kind
    org_id: str
    id: UUID

    @property
    def name(self) -> str:
        return f"{self.org_id}/{self.kind}/{self.id}"

    @classmethod
    def run(cls, org_id: str, run_id: UUID) -> ActorKey:
        return cls("run", org_id, run_id)

    @classmethod
    def session(cls, org_id: str, session_id: UUID) -> ActorKey:
        return cls("session", org_id, session_id)

    @classmethod
    def parse(cls, name: str) -> ActorKey | None:
        """The key an actor name stands for; ``None`` for names that are not ours.

        Organisation ids may hold ``/``, so the kind and id are read from the right.
        """
        org_id, _, rest = name.rpartition("/")
        org_id, _, kind = org_id.rpartition("/")
        if not org_id or kind not in ("run", "session"):
            return None
        try:
            return cls("run" if kind == "run" else "session", org_id, UUID(rest))
        except ValueError:
            return None
