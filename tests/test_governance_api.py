"""Connectors, grants and the audit log through the core's use cases and HTTP (issue 18,
points 2 and 8): admins only, 4xx with a reason for bad input, nothing across
organisations, and the gate's decisions read back from the audit route."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from cortex_ray import AgentMode, Grant, InProcessExecutor, Principal, Runtime, Settings
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database
from tests.test_connector_grants import CRM, TOOLS, ran


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        tools=TOOLS,
        connectors=[CRM],
    )
    yield rt
    await rt.close(close_db=False)


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[httpx2.AsyncClient]:
    from serve import create_app

    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    await executor.aclose()


async def key(runtime: Runtime, org: str, who: str, *, admin: bool) -> dict[str, str]:
    created = await runtime.create_api_key(org, who, admin=admin, grant=["*"])
    return {"Authorization": f"Bearer {created.key}"}


def error(r: httpx2.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    message = r.json()["error"]["message"]
    assert message
    return str(message)


async def test_connectors_and_grants_over_http(
    runtime: Runtime, http: httpx2.AsyncClient, org: str
) -> None:
    ran.clear()
    await runtime.store.ensure_org(org)
    admin = await key(runtime, org, "root", admin=True)
    member = await key(runtime, org, "bob", admin=False)
    agent = await runtime.create_agent(
        org, "clerk", mode=AgentMode.INTERACTIVE, tools=["crm_lookup", "crm_update"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    base = f"/api/orgs/{org}"

    listed = (await http.get(f"{base}/connectors", headers=member)).json()["connectors"]
    assert listed == [
        {
            "name": "crm", "description": "The CRM.", "tools": ["crm_lookup", "crm_update"],
            "sensitiveFields": ["SSN", "email"], "installed": False, "enabled": False,
            "config": {}, "health": "not installed", "healthCheckedAt": None,
        }
    ]  # fmt: skip
    # Installing is an admin's; bad input is a 4xx naming what was wrong.
    assert "only an admin" in error(
        await http.put(f"{base}/connectors/crm", headers=member, json={}), 403
    )
    assert "no connector 'mail'" in error(
        await http.put(f"{base}/connectors/mail", headers=admin, json={}), 404
    )
    secret = {"config": {"api_key": "sk-live-123456789012345678901234"}}
    assert "credential" in error(
        await http.put(f"{base}/connectors/crm", headers=admin, json=secret), 422
    )
    body = {"principalId": "*", "connector": "crm"}
    assert "not installed" in error(
        await http.post(f"{base}/grants", headers=admin, json=body), 404
    )
    r = await http.put(f"{base}/connectors/crm", headers=admin, json={"config": {"region": "eu"}})
    assert r.status_code == 200 and r.json()["enabled"] is True
    r = await http.post(f"{base}/connectors/crm/check", headers=admin)
    assert r.json()["health"] == "unknown"  # no probe registered

    bad = [
        ({**body, "tools": ["crm_delete"]}, 422, "not tools of connector 'crm': crm_delete"),
        ({**body, "constraints": {"to": {"format": "email"}}}, 422, "'format' is not supported"),
        ({**body, "expiresAt": "2020-01-01T00:00:00Z"}, 422, "in the past"),
        ({**body, "maxTier": "root"}, 422, "maxTier"),
        ({**body, "connector": "crm; drop"}, 422, "connector"),
    ]
    for payload, status, why in bad:
        assert why in error(await http.post(f"{base}/grants", headers=admin, json=payload), status)
    assert not (await runtime.governance.list_grants(org))

    # The gate decides a direct call: the agent's grant and the caller's are both needed.
    call = {"agentId": "clerk", "args": {"name": "ann"}}
    obs = (await http.post(f"{base}/tools/crm_lookup", headers=member, json=call)).json()
    assert obs["status"] == "REFUSED" and "has no grant of connector 'crm'" in obs["summary"]
    for principal in (agent.principal().id, "bob"):
        r = await http.post(
            f"{base}/grants", headers=admin, json={"principalId": principal, "connector": "crm"}
        )
        assert r.status_code == 201, r.text
    obs = (await http.post(f"{base}/tools/crm_lookup", headers=member, json=call)).json()
    assert obs["status"] == "OK" and obs["output"]["email"] == "[REDACTED]"
    obs = (await http.post(f"{base}/tools/crm_update", headers=member, json=call)).json()
    assert obs["status"] == "REFUSED" and "above grant" in obs["summary"]
    assert ran == [("crm_lookup", {"name": "ann"})]

    grants = (await http.get(f"{base}/grants", headers=admin)).json()["grants"]
    assert [g["principalId"] for g in grants] == [agent.principal().id, "bob"]
    assert error(await http.get(f"{base}/grants", headers=member), 403)
    bobs = grants[1]["id"]
    r = await http.delete(f"{base}/grants/{bobs}", headers=admin)
    assert r.status_code == 200 and r.json()["revokedAt"]
    obs = (await http.post(f"{base}/tools/crm_lookup", headers=member, json=call)).json()
    assert obs["status"] == "REFUSED"  # revoked: at once
    assert "no grant" in error(
        await http.delete(f"{base}/grants/{uuid.uuid4()}", headers=admin), 404
    )

    audit = (await http.get(f"{base}/audit?gateOnly=true", headers=admin)).json()["entries"]
    assert [(a["tool"], a["decision"], a["tier"]) for a in audit] == [
        ("crm_lookup", "denied", "read"),
        ("crm_lookup", "allowed", "read"),
        ("crm_update", "denied", "write"),
        ("crm_lookup", "denied", "read"),
    ]
    assert audit[1]["resultSha256"] and audit[1]["connector"] == "crm"
    assert audit[1]["grantIds"] and len(audit[1]["grantIds"]) == 2
    assert error(await http.get(f"{base}/audit", headers=member), 403)
    everything = (await http.get(f"{base}/audit", headers=admin)).json()["entries"]
    assert {"connectors.install", "grants.create", "grants.revoke"} <= {
        a["tool"] for a in everything
    }


async def test_nothing_crosses_organisations(
    runtime: Runtime, http: httpx2.AsyncClient, org: str
) -> None:
    other = f"{org}-b"
    for o in (org, other):
        await runtime.store.ensure_org(o)
        await runtime.governance.install_connector(o, "crm")
    mine = await runtime.governance.create_grant(
        org, _request("alice"), principal=Principal.operator(org)
    )
    intruder = await key(runtime, other, "mallory", admin=True)
    base = f"/api/orgs/{org}"
    for method, path, body in [
        ("GET", "/grants", None),
        ("GET", "/audit", None),
        ("GET", "/connectors", None),
        ("PUT", "/connectors/crm", {}),
        ("POST", "/grants", {"principalId": "mallory", "connector": "crm"}),
        ("DELETE", f"/grants/{mine.id}", None),
    ]:
        r = await http.request(method, base + path, headers=intruder, json=body)
        assert "not found" in error(r, 404)
    # In its own organisation the intruder cannot reach the other's grant either.
    r = await http.delete(f"/api/orgs/{other}/grants/{mine.id}", headers=intruder)
    assert error(r, 404)
    assert (await runtime.governance.list_grants(org))[0].revoked_at is None
    assert await runtime.governance.list_grants(other) == []
    assert all(r["org_id"] == org for r in await runtime.store.audit_rows(org))


def _request(principal_id: str) -> Any:
    from cortex_ray.governance import GrantRequest

    return GrantRequest(principal_id=principal_id, connector="crm")
