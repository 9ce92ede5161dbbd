"""Per-organisation secrets (issue 18, point 7): connector credentials, encrypted at rest.

Each value is sealed with AES-256-GCM under one key from the environment
(``CORTEX_GOVERNANCE__SECRET_KEY``) or a file (``CORTEX_GOVERNANCE__SECRET_KEY_FILE``, default
``<data_dir>/secret.key``, made with mode 0600 on first use); the organisation and the
secret's name are the associated data, so a ciphertext copied to another organisation's
row, or another name, does not open. Values leave the store only into a tool's handler
(``ToolContext.secret``), and only for a tool of the secret's connector when it names one;
the API lists names, never values, and the gate redacts any value a call read from what the
call returns before it is kept or shown (audit, step log, model, diagnostics).

**Rotation.** The older keys in ``CORTEX_GOVERNANCE__SECRET_PREVIOUS_KEYS`` still open what
they sealed (the current key is tried first); ``SecretStore.rotate`` re-seals every row that only an
older key opens under the current one, under a lock, so that the older keys can then be
dropped.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConfigurationError,
    InvalidRequestError,
    NotFoundError,
)
from cortex_ray._types import utcnow
from cortex_ray.settings import GovernanceOptions
from cortex_ray.storage import Database

__all__ = ["Rotation", "SecretInfo", "SecretStore", "load_previous_keys", "load_secret_key"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
MAX_SECRET_BYTES = 16_384


def load_secret_key(options: GovernanceOptions, data_dir: Path) -> bytes:
    """The 32-byte key: ``options.secret_key``, else ``options.secret_key_file``, else
    ``data_dir/secret.key`` (``Settings.storage.data_dir``; made on first use).

    Raises:
        ConfigurationError: A key that is not 32 bytes of urlsafe base64.
    """
    if options.secret_key is not None:
        text = options.secret_key.get_secret_value()
        where = "CORTEX_GOVERNANCE__SECRET_KEY"
    else:
        path = options.secret_key_file or Path(data_dir) / "secret.key"
        where = str(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode())
        text = path.read_text().strip()
    return _key(text, where)


def _key(text: str, where: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip().encode())
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ConfigurationError(f"the secret key ({where}) must be 32 bytes, urlsafe base64")
    return key


def load_previous_keys(options: GovernanceOptions) -> list[bytes]:
    """The older keys still accepted for reading (``secret_previous_keys``), in order.

    Raises:
        ConfigurationError: One is not 32 bytes of urlsafe base64 (its position says which).
    """
    if options.secret_previous_keys is None:
        return []
    parts = [p for p in options.secret_previous_keys.get_secret_value().split(",") if p.strip()]
    return [
        _key(p, f"CORTEX_GOVERNANCE__SECRET_PREVIOUS_KEYS, key {i + 1}")
        for i, p in enumerate(parts)
    ]


@dataclass(frozen=True, slots=True)
class Rotation:
    """What ``SecretStore.rotate`` did: rows re-sealed under the current key, rows already
    sealed under it, and rows no key opens (left as they are: ``(organisation, name)``)."""

    resealed: int
    current: int
    unreadable: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """A secret as anyone but a tool sees it: its name and who set it when, no value."""

    name: str
    connector: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime


class SecretStore:
    """Sealed per-organisation secrets (see the module docstring)."""

    def __init__(self, db: Database, options: GovernanceOptions, data_dir: Path) -> None:
        """``options``: ``Settings.governance`` (the keys); ``data_dir``:
        ``Settings.storage.data_dir`` (where the key file is made when none is given)."""
        self.db = db
        self._options = options
        self._data_dir = data_dir
        self._aead: AESGCM | None = None
        self._older: list[AESGCM] | None = None

    def _cipher(self) -> AESGCM:
        if self._aead is None:  # the key is read when a secret is first used
            self._aead = AESGCM(load_secret_key(self._options, self._data_dir))
        return self._aead

    def _ciphers(self) -> list[AESGCM]:
        """The current key's cipher first, then the older keys' (for reading only)."""
        if self._older is None:
            self._older = [AESGCM(k) for k in load_previous_keys(self._options)]
        return [self._cipher(), *self._older]

    def _open(self, org_id: str, name: str, nonce: bytes, sealed: bytes) -> tuple[bytes, int]:
        """The clear bytes and the index of the key that opened them (0: the current).

        Raises:
            InvalidTag: No key opens them.
        """
        aad = self._aad(org_id, name)
        for index, cipher in enumerate(self._ciphers()):
            try:
                return cipher.decrypt(nonce, sealed, aad), index
            except InvalidTag:
                continue
        raise InvalidTag

    async def rotate(self, batch: int = 500) -> Rotation:
        """Re-seal, under the current key, every secret of every organisation that only an
        older key opens; each batch in one transaction, its rows locked (a secret set
        meanwhile is sealed under the current key already). Rows no key opens are counted
        and left alone."""
        resealed = current = 0
        unreadable: list[tuple[str, str]] = []
        after = ("", "")
        while True:
            async with self.db.transaction() as conn:
                cur = await conn.execute(
                    """
                    SELECT org_id, name, nonce, ciphertext FROM org_secrets
                    WHERE (org_id, name) > (%s, %s) ORDER BY org_id, name LIMIT %s FOR UPDATE
                    """,
                    (*after, batch),
                )
                rows = await cur.fetchall()
                for row in rows:
                    org_id, name = row["org_id"], row["name"]
                    try:
                        data, index = self._open(
                            org_id, name, bytes(row["nonce"]), bytes(row["ciphertext"])
                        )
                    except InvalidTag:
                        unreadable.append((org_id, name))
                        continue
                    if index == 0:
                        current += 1
                        continue
                    nonce = os.urandom(12)
                    sealed = self._cipher().encrypt(nonce, data, self._aad(org_id, name))
                    await conn.execute(
                        "UPDATE org_secrets SET nonce = %s, ciphertext = %s "
                        "WHERE org_id = %s AND name = %s",
                        (nonce, sealed, org_id, name),
                    )
                    resealed += 1
            if len(rows) < batch:
                return Rotation(resealed, current, tuple(unreadable))
            after = (rows[-1]["org_id"], rows[-1]["name"])

    @staticmethod
    def _aad(org_id: str, name: str) -> bytes:
        return f"cortex-ray secret\x00{org_id}\x00{name}".encode()

    async def put(
        self, org_id: str, name: str, value: str, *, connector: str | None, by: str
    ) -> SecretInfo:
        if not _NAME.match(name):
            raise InvalidRequestError(
                "a secret's name is a letter or '_' then up to 99 letters, digits, '_', '.', '-'"
            )
        data = value.encode()
        if not data or len(data) > MAX_SECRET_BYTES:
            raise InvalidRequestError(f"a secret's value is 1 to {MAX_SECRET_BYTES} bytes")
        nonce = os.urandom(12)
        sealed = self._cipher().encrypt(nonce, data, self._aad(org_id, name))
        now = utcnow()
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                INSERT INTO org_secrets (org_id, name, connector, nonce, ciphertext,
                                         created_by, created_at, updated_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (org_id, name) DO UPDATE SET connector = EXCLUDED.connector,
                    nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext,
                    created_by = EXCLUDED.created_by, updated_at = EXCLUDED.updated_at
                RETURNING name, connector, created_by, created_at, updated_at
                """,
                (org_id, name, connector, nonce, sealed, by, now, now),
            )
            row = await cur.fetchone()
        assert row is not None
        return SecretInfo(**row)

    async def list(self, org_id: str) -> list[SecretInfo]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT name, connector, created_by, created_at, updated_at FROM org_secrets
                WHERE org_id = %s ORDER BY name
                """,
                (org_id,),
            )
            return [SecretInfo(**r) for r in await cur.fetchall()]

    async def delete(self, org_id: str, name: str) -> None:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "DELETE FROM org_secrets WHERE org_id = %s AND name = %s RETURNING name",
                (org_id, name),
            )
            if await cur.fetchone() is None:
                raise NotFoundError(f"no secret {name!r} in this organisation")

    async def reveal(self, org_id: str, name: str, *, connector: str | None) -> str:
        """The clear value, for a tool's handler only (``ToolContext.secret``).

        Raises:
            NotFoundError: No such secret in the organisation.
            AccessDeniedError: The secret belongs to another connector than the tool's.
        """
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT connector, nonce, ciphertext FROM org_secrets "
                "WHERE org_id = %s AND name = %s",
                (org_id, name),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no secret {name!r} in this organisation")
        if row["connector"] is not None and row["connector"] != connector:
            raise AccessDeniedError(f"secret {name!r} belongs to connector {row['connector']!r}")
        try:
            data, _ = self._open(org_id, name, bytes(row["nonce"]), bytes(row["ciphertext"]))
        except InvalidTag:
            raise ConfigurationError(
                f"secret {name!r} does not open with this key (was the key changed?)"
            ) from None
        return data.decode()
