"""The API key use cases on the fakes, decided and audited by the real gate."""

from __future__ import annotations

import hashlib

import pytest
from fakes import FakeStore, FakeTransaction

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError, NotFoundError
from cortex_ray._types import Grant, Principal, PrincipalKind
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._keys import KeyUseCases

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
MEMBER = Principal(id="bob", org_id="acme")


@pytest.fixture
def keys(gate: AccessGate[FakeTransaction], fake_store: FakeStore) -> KeyUseCases:
    return KeyUseCases(gate, fake_store)


def _rows(store: FakeStore) -> list[tuple[object, ...]]:
    return [(r["tool"], r["status"], r["action_type"], r["principal_id"]) for r in store.audit]


async def test_a_key_authenticates_until_it_is_revoked(
    keys: KeyUseCases, fake_store: FakeStore
) -> None:
    created = await keys.create_api_key("acme", "ci", grant=["current_time"], principal=ADMIN)
    assert created.warnings == ()
    who = await keys.authenticate(created.key)
    assert who is not None
    assert (who.id, who.org_id, who.is_admin) == ("ci", "acme", False)
    assert who.grant == Grant(tools=frozenset({"current_time"}))
    revoked = await keys.revoke_api_key("acme", created.key_id, principal=ADMIN)
    assert revoked.revoked_now and revoked.key_id == created.key_id
    assert await keys.authenticate(created.key) is None
    again = await keys.revoke_api_key("acme", created.key_id, principal=ADMIN)
    assert (again.revoked_now, again.revoked_at) == (False, revoked.revoked_at)
    # One row for the key, one for the revocation that changed something.
    assert _rows(fake_store) == [
        ("api_keys.create", "OK", "GROUNDING", "root"),
        ("api_keys.revoke", "OK", "GROUNDING", "root"),
    ]
    assert fake_store.audit[0]["args"]["key_id"] == str(created.key_id)
    assert fake_store.audit[1]["args"] == {"key_id": str(created.key_id)}


async def test_only_the_keys_hash_is_kept(keys: KeyUseCases, fake_store: FakeStore) -> None:
    created = await keys.create_api_key("acme", "ci", principal=ADMIN)
    stored = fake_store.api_keys["acme", created.key_id]
    assert stored.key_hash == hashlib.sha256(created.key.encode()).digest()
    assert created.key not in repr(vars(fake_store))
    assert created.key not in repr(fake_store.audit)


async def test_a_key_without_a_grant_says_what_it_cannot_do(keys: KeyUseCases) -> None:
    created = await keys.create_api_key("acme", "ci", principal=ADMIN)
    assert created.principal.grant is None
    assert len(created.warnings) == 1 and "has no grant" in created.warnings[0]


async def test_a_key_for_an_existing_principal_keeps_what_is_not_given(
    keys: KeyUseCases, fake_store: FakeStore
) -> None:
    await fake_store.put_principal(Principal(id="ops", org_id="acme", name="Ops", is_admin=True))
    created = await keys.create_api_key("acme", "ops", principal=ADMIN)
    assert (created.principal.name, created.principal.is_admin) == ("Ops", True)
    assert await keys.authenticate(created.key) == created.principal


async def test_a_member_may_not_create_or_revoke_keys(
    keys: KeyUseCases, fake_store: FakeStore
) -> None:
    created = await keys.create_api_key("acme", "ci", principal=ADMIN)
    with pytest.raises(AccessDeniedError):
        await keys.create_api_key("acme", "bob", admin=True, principal=MEMBER)
    with pytest.raises(AccessDeniedError):
        await keys.revoke_api_key("acme", created.key_id, principal=MEMBER)
    assert await keys.authenticate(created.key) is not None
    assert ("acme", "bob") not in fake_store.principals
    assert _rows(fake_store)[1:] == [
        ("api_keys.create", "REFUSED", "GROUNDING", "bob"),
        ("api_keys.revoke", "REFUSED", "GROUNDING", "bob"),
    ]


async def test_agents_get_no_keys_and_unknown_keys_are_not_found(
    keys: KeyUseCases, fake_store: FakeStore
) -> None:
    with pytest.raises(InvalidRequestError, match="not agents"):
        await keys.create_api_key("acme", "bot", kind=PrincipalKind.AGENT, principal=ADMIN)
    created = await keys.create_api_key("acme", "ci", principal=ADMIN)
    outsider = Principal(id="eve", org_id="umbrella", is_admin=True)
    with pytest.raises(NotFoundError):
        await keys.revoke_api_key("umbrella", created.key_id, principal=outsider)
    assert await keys.authenticate(created.key) is not None
    assert await keys.authenticate("crx_nope_nope") is None
    assert [r[1] for r in _rows(fake_store)] == ["OK"]
