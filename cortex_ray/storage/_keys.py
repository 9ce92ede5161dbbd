"""API keys: bearer keys of principals, kept as hashes."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from uuid import UUID, uuid4

from cortex_ray._exceptions import NotFoundError
from cortex_ray._types import Principal
from cortex_ray.storage._principals import PrincipalRows, principal_of

__all__ = ["KeyRows"]


def _key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRows(PrincipalRows):
    """Keys created (with their principal, on first use), resolved and revoked."""

    async def create_api_key(self, principal: Principal, name: str = "") -> tuple[str, UUID]:
        """A new bearer key for ``principal``: the key is returned once, only its hash is kept.

        Keys carry 256 random bits, so a plain SHA-256 (not a slow password hash) is the
        right digest: nothing to brute-force, and lookups stay one index probe.
        """
        if not await self._has_principal(principal):
            await self.put_principal(principal)
        key_id = uuid4()
        prefix = secrets.token_hex(4)
        key = f"crx_{prefix}_{secrets.token_urlsafe(32)}"
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO api_keys (org_id, id, principal_id, key_hash, prefix, name)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                (principal.org_id, key_id, principal.id, _key_hash(key), prefix, name),
            )
        return key, key_id

    async def principal_for_api_key(self, key: str) -> Principal | None:
        """The principal a bearer key belongs to, or None (unknown, malformed or revoked)."""
        if not key.startswith("crx_") or len(key) > 200:
            return None
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT p.* FROM api_keys k
                JOIN principals p ON p.org_id = k.org_id AND p.id = k.principal_id
                WHERE k.key_hash = %s AND k.revoked_at IS NULL
                """,
                (_key_hash(key),),
            )
            row = await cur.fetchone()
        return None if row is None else principal_of(row)

    async def revoke_api_key(self, org_id: str, key_id: UUID) -> tuple[datetime, bool]:
        """Revoke a key: when it was revoked, and whether this call did it (``False``: it
        already was, and nothing changed)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "UPDATE api_keys SET revoked_at = now() "
                "WHERE org_id = %s AND id = %s AND revoked_at IS NULL RETURNING revoked_at",
                (org_id, key_id),
            )
            row = await cur.fetchone()
            if row is not None:
                return row["revoked_at"], True
            cur = await conn.execute(
                "SELECT revoked_at FROM api_keys WHERE org_id = %s AND id = %s",
                (org_id, key_id),
            )
            row = await cur.fetchone()
        if row is None or row["revoked_at"] is None:
            raise NotFoundError(f"no API key {key_id} in organisation {org_id!r}")
        return row["revoked_at"], False
