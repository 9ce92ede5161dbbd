"""A person's own credentials for a per-principal MCP server, through the HTTP API on the
real PostgreSQL against a real streamable-HTTP MCP server (the SDK's, behind a bearer token):
each member sets their own token, each call is made with the caller's own, and nobody's
value is ever returned or audited."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest
from mcp_servers import HttpServer, free_port

from cortex_ray import InProcessExecutor, Runtime, Settings
from cortex_ray.mcp import mcp_tool_name
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database

pytestmark = pytest.mark.timeout(300)

TOKEN = "tok-ada-7f3"
WEATHER = mcp_tool_name("wx", "weather")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = HttpServer(free_port(), tmp_path_factory.mktemp("mcp-credentials"), TOKEN)
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
async def http(db: Database, settings: Settings) -> AsyncIterator[tuple[Runtime, Any]]:
    from serve import create_app

    runtime = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        connectors=[],
    )  # the SDK client of this process: the real protocol to the real server
    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        yield runtime, client
    await executor.aclose()
    await runtime.close(close_db=False)


async def _key(runtime: Runtime, org: str, who: str, *, admin: bool) -> dict[str, str]:
    created = await runtime.create_api_key(org, who, admin=admin, grant=["*"])
    return {"Authorization": f"Bearer {created.key}"}


def _ok(r: httpx2.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json() if r.content else None


def _error(r: httpx2.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return str(r.json()["error"]["message"])


async def test_each_person_calls_a_per_principal_server_with_their_own_token(
    http: tuple[Runtime, Any], server_url: str, org: str
) -> None:
    runtime, client = http
    admin = await _key(runtime, org, "root", admin=True)
    ada = await _key(runtime, org, "ada", admin=False)
    bob = await _key(runtime, org, "bob", admin=False)
    base = f"/api/orgs/{org}"
    server = {"transport": "http", "url": server_url, "bearerSecret": "wx_token",
              "perPrincipal": True}  # fmt: skip
    _ok(await client.post(f"{base}/connectors/mcp", json={"name": "wx", "server": server},
                          headers=admin), 201)  # fmt: skip

    # Each member sets their own token; it comes back as a name, never a value.
    mine = _ok(await client.put(f"{base}/connectors/mcp/wx/credentials/wx_token",
                                json={"value": TOKEN}, headers=ada))  # fmt: skip
    assert (mine["name"], mine["connector"], mine["createdBy"]) == (
        "wx_token.principal.ada",
        "wx",
        "ada",
    )
    assert TOKEN not in str(mine)
    _ok(await client.put(f"{base}/connectors/mcp/wx/credentials/wx_token",
                         json={"value": "not-the-token"}, headers=bob))  # fmt: skip
    _ok(await client.put(f"{base}/connectors/mcp/wx/credentials/wx_token",
                         json={"value": TOKEN}, headers=admin))  # fmt: skip
    # Only a secret the server names, only on a per-principal server, only an existing one.
    reason = _error(await client.put(f"{base}/connectors/mcp/wx/credentials/other",
                                     json={"value": "x"}, headers=ada), 422)  # fmt: skip
    assert "names no secret 'other'" in reason
    _error(await client.put(f"{base}/connectors/mcp/nope/credentials/wx_token",
                            json={"value": "x"}, headers=ada), 404)  # fmt: skip

    # The admin's own token lists and pins the tools; a grant opens the connector.
    _ok(await client.post(f"{base}/connectors/mcp/wx/refresh", headers=admin))
    grant = {"principalId": "*", "connector": "wx", "maxTier": "read"}
    _ok(await client.post(f"{base}/grants", json=grant, headers=admin), 201)
    agent = {"name": "forecaster", "mode": "INTERACTIVE", "tools": [WEATHER],
             "grant": {"tools": [WEATHER]}}  # fmt: skip
    _ok(await client.post(f"{base}/agents", json=agent, headers=admin), 201)

    # Ada's call carries her token: the server answers.
    call = {"agentId": "forecaster", "args": {"city": "Oslo"}}
    done = _ok(await client.post(f"{base}/tools/{WEATHER}", json=call, headers=ada))
    assert done["status"] == "OK", done
    assert done["output"] == {"city": "Oslo", "celsius": 21.5}
    # Bob's carries his, which the server refuses: a failed observation, nothing stuck.
    refused = _ok(await client.post(f"{base}/tools/{WEATHER}", json=call, headers=bob))
    assert refused["status"] == "ERROR" and "wx" in refused["summary"], refused

    # Removed: Bob's next call has no token of his own to send.
    r = await client.delete(f"{base}/connectors/mcp/wx/credentials/wx_token", headers=bob)
    assert r.status_code == 204, r.text
    gone = _ok(await client.post(f"{base}/tools/{WEATHER}", json=call, headers=bob))
    assert gone["status"] == "ERROR" and "wx_token.principal.bob" in gone["summary"], gone

    # Audited by name, never by value.
    rows = await runtime.store.audit_rows(org)
    set_rows = [r for r in rows if r["tool"] == "connectors.mcp.credential"]
    assert [(r["principal_id"], r["status"]) for r in set_rows][:2] == [
        ("ada", "OK"), ("bob", "OK")
    ]  # fmt: skip
    assert all(TOKEN not in str(r["args"]) and "not-the-token" not in str(r["args"])
               for r in rows)  # fmt: skip
