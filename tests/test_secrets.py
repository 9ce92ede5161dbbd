"""Per-organisation secrets (issue 18, point 7): sealed at rest, read only by the tools of
their connector, redacted from whatever a call returns, never returned by the API."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cortex_ray import (
    AgentMode,
    ConfigurationError,
    Grant,
    InProcessExecutor,
    ObservationStatus,
    Principal,
    Runtime,
    Settings,
)
from cortex_ray.act import Tool, ToolContext
from cortex_ray.governance import Connector, GrantRequest, SecretStore, load_secret_key
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.settings import GovernanceOptions
from cortex_ray.storage import Database

TOKEN = "tok-4f1d9c2e7b"


async def leaky(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    token = await ctx.secret("crm_token")
    if args.get("fail"):
        raise RuntimeError(f"login with {token} refused")
    return {"called_with": f"Bearer {token}", "ok": True}


async def thief(ctx: ToolContext, args: dict[str, Any]) -> str:
    return await ctx.secret("crm_token")


TOOLS = [
    Tool(name="crm_ping", description="", handler=leaky, connector="crm",
         parameters={"type": "object", "properties": {"fail": {"type": "boolean"}}}),
    Tool(name="mail_ping", description="", handler=thief, connector="mail"),
]  # fmt: skip


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        tools=TOOLS,
        connectors=[Connector(name="crm"), Connector(name="mail")],
    )
    yield rt
    await rt.close(close_db=False)


async def setup(runtime: Runtime, org: str) -> None:
    await runtime.store.ensure_org(org)
    await runtime.create_agent(
        org, "a", mode=AgentMode.INTERACTIVE, tools=["crm_ping", "mail_ping"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    for name in ("crm", "mail"):
        await runtime.governance.install_connector(org, name)
        await runtime.governance.create_grant(
            org, GrantRequest(principal_id="*", connector=name, max_tier="write")
        )
    await runtime.governance.put_secret(org, "crm_token", TOKEN, connector="crm")


async def test_sealed_at_rest_and_bound_to_its_row(
    runtime: Runtime, db: Database, org: str
) -> None:
    await setup(runtime, org)
    async with db.connection() as conn:
        row = await (
            await conn.execute("SELECT * FROM org_secrets WHERE org_id = %s", (org,))
        ).fetchone()
    assert row is not None
    assert TOKEN.encode() not in bytes(row["ciphertext"]) + bytes(row["nonce"])
    assert TOKEN not in str(row)
    # The same ciphertext under another organisation or name does not open.
    other = f"{org}-b"
    await runtime.store.ensure_org(other)
    async with db.transaction() as conn:
        for o, n in ((other, "crm_token"), (org, "copy")):
            await conn.execute(
                "INSERT INTO org_secrets (org_id, name, connector, nonce, ciphertext, "
                "created_by) VALUES (%s, %s, 'crm', %s, %s, 'x')",
                (o, n, row["nonce"], row["ciphertext"]),
            )
    for o, n in ((other, "crm_token"), (org, "copy")):
        with pytest.raises(ConfigurationError, match="does not open"):
            await runtime.secrets.reveal(o, n, connector="crm")
    assert await runtime.secrets.reveal(org, "crm_token", connector="crm") == TOKEN


async def test_a_call_never_lets_a_secret_out(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    caller = await runtime.store.put_principal(
        Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    )
    obs = await runtime.invoke_tool(org, "a", caller, "crm_ping", {})
    assert obs.status is ObservationStatus.OK
    assert obs.output == {"called_with": "Bearer [REDACTED]", "ok": True}
    failed = await runtime.invoke_tool(org, "a", caller, "crm_ping", {"fail": True})
    assert failed.status is ObservationStatus.ERROR and TOKEN not in failed.summary
    assert "login with [REDACTED] refused" in failed.summary
    stolen = await runtime.invoke_tool(org, "a", caller, "mail_ping", {})
    assert stolen.status is ObservationStatus.ERROR
    assert "belongs to connector 'crm'" in stolen.summary
    rows = await runtime.store.audit_rows(org)
    assert TOKEN not in repr(rows)
    assert [i.name for i in await runtime.governance.list_secrets(org)] == ["crm_token"]


def test_the_key_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    made = load_secret_key(Settings().governance, tmp_path)
    key_file = tmp_path / "secret.key"
    assert len(made) == 32 and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert load_secret_key(Settings().governance, tmp_path) == made  # the same, not a new one
    given = base64.urlsafe_b64encode(b"k" * 32).decode()
    assert load_secret_key(Settings(secret_key=given).governance, tmp_path) == b"k" * 32
    with pytest.raises(ConfigurationError, match="32 bytes"):
        load_secret_key(Settings(secret_key="short").governance, tmp_path)


async def test_another_key_does_not_open_them(
    runtime: Runtime, db: Database, settings: Settings, org: str, tmp_path: Path
) -> None:
    await setup(runtime, org)
    other = SecretStore(
        db,
        settings.governance.model_copy(update={"secret_key_file": tmp_path / "k"}),
        settings.storage.data_dir,
    )
    with pytest.raises(ConfigurationError, match="does not open with this key"):
        await other.reveal(org, "crm_token", connector="crm")


async def test_secrets_over_http(runtime: Runtime, org: str) -> None:
    from serve import create_app

    await setup(runtime, org)
    admin = await runtime.create_api_key(org, "root", admin=True, grant=["*"])
    member = await runtime.create_api_key(org, "bob", admin=False, grant=["*"])
    intruder = await runtime.create_api_key(f"{org}-x", "eve", admin=True, grant=["*"])
    a, m, x = ({"Authorization": f"Bearer {k.key}"} for k in (admin, member, intruder))
    executor = InProcessExecutor(runtime)
    base = f"/api/orgs/{org}"
    try:
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            r = await http.put(f"{base}/secrets/mail_key", headers=a, json={"value": "s3cr3t-v"})
            assert r.status_code == 200 and "s3cr3t-v" not in r.text
            listed = (await http.get(f"{base}/secrets", headers=a)).json()["secrets"]
            assert [s["name"] for s in listed] == ["crm_token", "mail_key"]
            assert TOKEN not in str(listed) and "s3cr3t-v" not in str(listed)
            for bad, why in [
                ({"value": ""}, "value"),
                ({"value": "v", "connector": "nope"}, "no connector 'nope'"),
                ({"value": "v", "extra": 1}, "extra"),
            ]:
                r = await http.put(f"{base}/secrets/k", headers=a, json=bad)
                assert r.status_code in (404, 422) and why in r.text, r.text
            r = await http.put(f"{base}/secrets/bad%20name", headers=a, json={"value": "v"})
            assert r.status_code == 422
            r = await http.put(f"{base}/secrets/k", headers=m, json={"value": "v"})
            assert r.status_code == 403
            assert (await http.get(f"{base}/secrets", headers=m)).status_code == 403
            for method in ("GET", "PUT", "DELETE"):
                path = "/secrets" if method == "GET" else "/secrets/crm_token"
                r = await http.request(method, base + path, headers=x, json={"value": "pwn"})
                assert r.status_code == 404, (method, r.text)
            assert (await http.delete(f"{base}/secrets/mail_key", headers=a)).status_code == 204
            assert (await http.delete(f"{base}/secrets/mail_key", headers=a)).status_code == 404
        assert await runtime.secrets.reveal(org, "crm_token", connector="crm") == TOKEN
        assert "s3cr3t-v" not in repr(await runtime.store.audit_rows(org))
    finally:
        await executor.aclose()


async def test_rotating_the_key_reseals_every_secret(
    runtime: Runtime, db: Database, settings: Settings, org: str
) -> None:
    """Under a new key with the old one still accepted for reading, every secret opens;
    rotation re-seals them under the new key, after which the old key is not needed (and
    no longer opens them); a row no key opens is reported and left alone."""
    from pydantic import SecretStr

    def keyed(current: bytes, *older: bytes) -> GovernanceOptions:
        encode = lambda k: base64.urlsafe_b64encode(k).decode()  # noqa: E731
        return settings.governance.model_copy(
            update={
                "secret_key": SecretStr(encode(current)),
                "secret_previous_keys": SecretStr(",".join(map(encode, older))) if older else None,
            }
        )

    data_dir = settings.storage.data_dir

    old, new, stranger = b"o" * 32, b"n" * 32, b"s" * 32
    other = f"{org}-b"
    for o in (org, other):
        await runtime.store.ensure_org(o)
    sealed_old = SecretStore(db, keyed(old), data_dir)
    for o in (org, other):
        await sealed_old.put(o, "crm_token", f"{TOKEN}-{o}", connector="crm", by="x")
    await SecretStore(db, keyed(stranger), data_dir).put(org, "lost", "v", connector=None, by="x")

    rotating = SecretStore(db, keyed(new, old), data_dir)
    assert await rotating.reveal(org, "crm_token", connector="crm") == f"{TOKEN}-{org}"
    with pytest.raises(ConfigurationError, match="does not open"):
        await SecretStore(db, keyed(new), data_dir).reveal(org, "crm_token", connector="crm")

    done = await rotating.rotate(batch=1)  # one row per transaction: the paging is exercised
    assert done.resealed >= 2 and (org, "lost") in done.unreadable
    assert (org, "crm_token") not in done.unreadable
    only_new = SecretStore(db, keyed(new), data_dir)
    for o in (org, other):
        assert await only_new.reveal(o, "crm_token", connector="crm") == f"{TOKEN}-{o}"
        with pytest.raises(ConfigurationError, match="does not open"):
            await sealed_old.reveal(o, "crm_token", connector="crm")
    again = await rotating.rotate()
    assert again.current >= 2 and (org, "lost") in again.unreadable
    mine = [(o, n) for o, n in again.unreadable if o in (org, other)]
    assert mine == [(org, "lost")]  # left as it was: still there, still sealed
    assert (
        await SecretStore(db, keyed(stranger), data_dir).reveal(org, "lost", connector=None) == "v"
    )
    bad = SecretStr(base64.urlsafe_b64encode(old).decode() + ",short")
    broken = keyed(new).model_copy(update={"secret_previous_keys": bad})
    with pytest.raises(ConfigurationError, match="PREVIOUS_KEYS, key 2"):
        await SecretStore(db, broken, data_dir).reveal(org, "crm_token", connector="crm")
