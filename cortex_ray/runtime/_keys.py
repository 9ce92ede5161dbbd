"""Principals and API keys as use cases: authenticate a bearer key, create and revoke
keys."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from pydantic import ValidationError

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Grant, Principal, PrincipalKind
from cortex_ray.access import UseCase
from cortex_ray.runtime._gate import UseCaseGate, first_error
from cortex_ray.storage import ApiKeyStore, PrincipalStore

__all__ = ["ApiKeyCreated", "ApiKeyRevoked", "KeyStore", "KeyUseCases"]


class KeyStore(PrincipalStore, ApiKeyStore, Protocol):
    """What the key use cases read and write: principals and their keys."""


@dataclass(frozen=True, slots=True)
class ApiKeyCreated:
    """A new API key: the bearer key (shown once; only its hash is kept), its id, and the
    principal it acts as."""

    key: str
    key_id: UUID
    principal: Principal
    warnings: tuple[str, ...] = ()
    """What the key cannot do as created (e.g. no grant: no tool calls until granted)."""


@dataclass(frozen=True, slots=True)
class ApiKeyRevoked:
    """A revoked API key: when it was revoked, and whether this call revoked it (``False``:
    it already was, and nothing changed)."""

    key_id: UUID
    revoked_at: datetime
    revoked_now: bool


class KeyUseCases:
    """API keys (``Runtime.authenticate``, ``create_api_key``, ``revoke_api_key``)."""

    def __init__(self, gate: UseCaseGate, store: KeyStore) -> None:
        self.gate = gate
        self.store = store

    async def authenticate(self, key: str) -> Principal | None:
        """The principal of a bearer API key, or ``None`` for an unknown or revoked one."""
        return await self.store.principal_for_api_key(key)

    async def create_api_key(
        self,
        org_id: str,
        principal_id: str,
        *,
        name: str = "",
        admin: bool | None = None,
        grant: Iterable[str] | None = None,
        kind: PrincipalKind = PrincipalKind.USER,
        principal: Principal | None = None,
    ) -> ApiKeyCreated:
        """A bearer key for ``principal_id`` (admin only), shown once; only its hash is kept.

        A new principal gets what the arguments say (no ``grant``: no tools, fail closed);
        for an existing one, ``admin`` and ``grant`` replace its settings when given."""
        args = {"principal": principal_id, "name": name, "admin": admin}
        caller = await self.gate.authorize(principal, UseCase.API_KEYS_CREATE, org_id, args=args)
        if kind is PrincipalKind.AGENT:
            raise InvalidRequestError("API keys are for users and services, not agents")
        try:
            existing: Principal | None = await self.store.get_principal(org_id, principal_id)
        except NotFoundError:
            existing = None
        is_admin = admin if admin is not None else bool(existing and existing.is_admin)
        policy = existing.grant if existing else None
        if grant is not None:
            policy = Grant(tools=frozenset(grant))
        try:
            wanted = Principal(
                id=principal_id,
                org_id=org_id,
                kind=kind,
                name=existing.name if existing else principal_id,
                is_admin=is_admin,
                grant=policy,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid principal: {first_error(exc)}") from exc
        if existing != wanted:
            await self.store.put_principal(wanted)
        key, key_id = await self.store.create_api_key(wanted, name)
        await self.gate.audited(
            caller, UseCase.API_KEYS_CREATE, org_id, args={**args, "key_id": str(key_id)}
        )
        warnings: tuple[str, ...] = ()
        if wanted.grant is None or not (wanted.grant.tools or wanted.grant.action_types):
            # Fail closed is right, but silent: say so while the key is being handed out.
            cannot = "call no tool" if is_admin else "call no tool nor search memory or knowledge"
            warnings = (
                f"principal {principal_id!r} has no grant: this key can {cannot} until it is "
                "granted some (create a key again with a grant, e.g. --grant current_time, "
                "or --grant '*' for every tool)",
            )
        return ApiKeyCreated(key=key, key_id=key_id, principal=wanted, warnings=warnings)

    async def revoke_api_key(
        self, org_id: str, key_id: UUID, *, principal: Principal | None = None
    ) -> ApiKeyRevoked:
        """Revoke a key (admin only): requests with it are refused from then on. Revoking a
        revoked key changes nothing and returns when it was revoked.

        Raises:
            NotFoundError: No such key in the organisation.
        """
        args = {"key_id": str(key_id)}
        caller = await self.gate.authorize(principal, UseCase.API_KEYS_REVOKE, org_id, args=args)
        revoked_at, revoked_now = await self.store.revoke_api_key(org_id, key_id)
        if revoked_now:
            await self.gate.audited(caller, UseCase.API_KEYS_REVOKE, org_id, args=args)
        return ApiKeyRevoked(key_id=key_id, revoked_at=revoked_at, revoked_now=revoked_now)
