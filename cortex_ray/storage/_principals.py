"""Organisations and principals: the rows every other store's rows belong to."""

from __future__ import annotations

from typing import Any

import psycopg

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal, PrincipalKind
from cortex_ray.storage._rows import StoreRows, grant_json, grant_of

__all__ = ["PrincipalRows", "principal_of"]


def principal_of(row: dict[str, Any]) -> Principal:
    return Principal(
        id=row["id"],
        org_id=row["org_id"],
        kind=PrincipalKind(row["kind"]),
        name=row["name"],
        is_admin=row["is_admin"],
        grant=grant_of(row["grant_policy"]),
    )


class PrincipalRows(StoreRows):
    """Organisations (created on first use) and the principals that act in them."""

    async def ensure_org(self, org_id: str, name: str = "") -> None:
        try:
            async with self.db.transaction() as conn:
                await conn.execute(
                    "INSERT INTO organisations (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    (org_id, name),
                )
        except psycopg.errors.CheckViolation as exc:
            raise InvalidRequestError(
                f"invalid organisation id {org_id!r}: use letters, digits, '_', '.', '-'"
            ) from exc

    async def put_principal(self, principal: Principal) -> Principal:
        await self.ensure_org(principal.org_id)
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO principals (org_id, id, kind, name, is_admin, grant_policy)
                VALUES (%s, %s, %s, %s, %s, %s)
                ON CONFLICT (org_id, id) DO UPDATE SET kind = EXCLUDED.kind,
                    name = EXCLUDED.name, is_admin = EXCLUDED.is_admin,
                    grant_policy = EXCLUDED.grant_policy
                """,
                (
                    principal.org_id,
                    principal.id,
                    principal.kind.value,
                    principal.name,
                    principal.is_admin,
                    grant_json(principal.grant),
                ),
            )
        return principal

    async def get_principal(self, org_id: str, principal_id: str) -> Principal:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM principals WHERE org_id = %s AND id = %s", (org_id, principal_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"principal {principal_id!r} not found in organisation {org_id!r}")
        return principal_of(row)

    async def _has_principal(self, principal: Principal) -> bool:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM principals WHERE org_id = %s AND id = %s",
                (principal.org_id, principal.id),
            )
            return await cur.fetchone() is not None
