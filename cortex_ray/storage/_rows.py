"""What every part of ``Store`` shares: the database handle, and grants as JSON."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from cortex_ray._types import Grant
from cortex_ray.storage._database import Database

__all__ = ["StoreRows", "grant_json", "grant_of"]


def grant_json(grant: Grant | None) -> Jsonb | None:
    return None if grant is None else Jsonb(grant.model_dump(mode="json"))


def grant_of(value: Any) -> Grant | None:
    return None if value is None else Grant.model_validate(value)


class StoreRows:
    """The base of every domain's rows: the database, and the state ``Store`` keeps (when
    it last pruned diagnostics)."""

    def __init__(self, db: Database) -> None:
        self._diagnostics_pruned: datetime | None = None
        self.db = db
