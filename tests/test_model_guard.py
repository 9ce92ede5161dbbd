"""The model routes' guards and the LLM's bounded line, on real Ray Serve with the packaged
SmolLM2 (llama.cpp) and the test run's PostgreSQL as the key store.

A guarded app (``require_keys=True``, a small body limit, one request in flight per key,
an LLM that keeps one request waiting: ``max_waiting=1``) and an unguarded one (``require_keys``
unset on Serve's loopback proxy) are deployed for the module. Raw sockets send the bodies
the HTTP clients would not: a declared 12 MB body that never comes, a chunked one that
does not stop, and a body held half-sent so that its request stays in flight.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx2
import pydantic
import pytest

from cortex_ray import Grant, Principal
from cortex_ray.storage import Database, Store

ray_serve = pytest.importorskip("ray.serve")

from serve.models import (  # noqa: E402
    LLM_NAME,
    DeploymentOptions,
    IngressConfig,
    LlmConfig,
    ModelServingConfig,
    build_models_app,
)
from serve.models._ingress import serve_binds_loopback_only  # noqa: E402

APP = "cortex-models-guard-test"
PREFIX = "/cortex-models-guard-test"
OPEN_APP = "cortex-models-open-test"
OPEN_PREFIX = "/cortex-models-open-test"
LLM_ID = "SmolLM2-135M-Instruct"
LIMIT = 64 * 1024


def _config(dsn: str | None, *, require_keys: bool | None) -> ModelServingConfig:
    env = {"runtime_env": {"env_vars": {"CORTEX_DATABASE_URL": dsn}}} if dsn else {}
    return ModelServingConfig(
        embedder=None,
        reranker=None,
        llm=LlmConfig(
            model_id=LLM_ID,
            n_ctx=1024,
            default_max_tokens=16,
            max_waiting=1,
            deployment=DeploymentOptions(ray_actor_options={"num_cpus": 0}),
        ),
        ingress=IngressConfig(
            require_keys=require_keys,
            max_body_bytes=LIMIT,
            max_concurrent_per_key=1,
            retry_after_s=3,
            deployment=DeploymentOptions(ray_actor_options={"num_cpus": 0, **env}),
        ),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_port(ray_cluster: Any) -> Iterator[int]:
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is not None:
        yield int(client.http_config.port)
        return
    port = _free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        ray_serve.shutdown()


@pytest.fixture(scope="module")
def guarded(serve_port: int, db: Database) -> Iterator[str]:
    ray_serve.run(
        build_models_app(_config(db.dsn, require_keys=True)), name=APP, route_prefix=PREFIX
    )
    try:
        yield f"http://127.0.0.1:{serve_port}{PREFIX}"
    finally:
        ray_serve.delete(APP)


@pytest.fixture(scope="module")
def open_url(serve_port: int) -> Iterator[str]:
    config = _config(None, require_keys=None).model_copy(update={"llm": None})
    ray_serve.run(build_models_app(config), name=OPEN_APP, route_prefix=OPEN_PREFIX)
    try:
        yield f"http://127.0.0.1:{serve_port}{OPEN_PREFIX}"
    finally:
        ray_serve.delete(OPEN_APP)


async def _key(store: Store, org: str, name: str = "models") -> str:
    await store.ensure_org(org)
    who = Principal(id=f"user-{name}", org_id=org, grant=Grant(tools=frozenset()))
    key, _ = await store.create_api_key(who, name)
    return key


def _error(r: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body: dict[str, Any] = r.json()
    # OpenAI's body, plus the correlation id the X-Correlation-Id header names too
    fields = {"message", "type", "param", "code", "correlationId"}
    assert set(body) == {"error"} and set(body["error"]) == fields
    assert body["error"]["correlationId"] == r.headers["x-correlation-id"]
    assert body["error"]["code"] == code, body
    return body


def _chat(max_tokens: int = 8, content: str = "Say hi.") -> dict[str, Any]:
    return {
        "model": LLM_ID,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


# --- raw HTTP/1.1, for bodies an HTTP client will not send ------------------------------------


def _open(url: str) -> tuple[socket.socket, str, str]:
    rest = url.removeprefix("http://")
    hostport, _, prefix = rest.partition("/")
    host, _, port = hostport.partition(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    return sock, hostport, "/" + prefix


def _head(method: str, path: str, host: str, headers: dict[str, str]) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and the body (by Content-Length) of one response; a socket timeout
    fails the test (the server waited for a body it should not have read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body[:length]


# --- keys -------------------------------------------------------------------------------------


async def test_the_model_routes_take_the_apis_keys(guarded: str, store: Store, org: str) -> None:
    key = await _key(store, org)
    async with httpx2.AsyncClient(base_url=guarded, timeout=120) as http:
        r = await http.get("/v1/models")
        assert r.headers["www-authenticate"] == "Bearer"
        _error(r, 401, "invalid_api_key")
        _error(await http.post("/v1/chat/completions", json=_chat()), 401, "invalid_api_key")
        wrong = {"Authorization": "Bearer crx_00000000_not-a-key-of-this-store"}
        r = await http.get("/v1/models", headers=wrong)
        assert "invalid_token" in r.headers["www-authenticate"]
        _error(r, 401, "invalid_api_key")
        _error(await http.get("/v1/models", headers={"Authorization": key}), 401, "invalid_api_key")
        good = {"Authorization": f"Bearer {key}"}
        r = await http.get("/v1/models", headers=good)
        assert r.status_code == 200, r.text
        assert [m["id"] for m in r.json()["data"]] == [LLM_ID]
        r = await http.post("/v1/chat/completions", json=_chat(), headers=good)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
        # /health stays open (liveness probes) and says that keys are asked for.
        health = await http.get("/health")
        assert health.status_code == 200 and health.json()["keys_required"] is True


async def test_a_revoked_key_is_refused(guarded: str, store: Store, org: str) -> None:
    await store.ensure_org(org)
    who = Principal(id="user-revoked", org_id=org, grant=Grant(tools=frozenset()))
    key, key_id = await store.create_api_key(who, "revoked")
    async with httpx2.AsyncClient(base_url=guarded, timeout=60) as http:
        auth = {"Authorization": f"Bearer {key}"}
        assert (await http.get("/v1/models", headers=auth)).status_code == 200
        await store.revoke_api_key(org, key_id)
        _error(await http.get("/v1/models", headers=auth), 401, "invalid_api_key")


async def test_loopback_only_serving_asks_for_no_key(open_url: str) -> None:
    assert serve_binds_loopback_only()  # the test run's Serve listens on 127.0.0.1
    async with httpx2.AsyncClient(base_url=open_url, timeout=60) as http:
        assert (await http.get("/v1/models")).status_code == 200
        assert (await http.get("/health")).json()["keys_required"] is False
        # The body limit holds without keys too.
        r = await http.post("/v1/embeddings", content=b"x" * (LIMIT + 1))
        _error(r, 413, "request_too_large")


# --- body size ------------------------------------------------------------------------------


async def test_a_declared_oversized_body_is_refused_before_it_is_read(
    guarded: str, store: Store, org: str
) -> None:
    key = await _key(store, org)
    sock, host, prefix = _open(guarded)
    with sock:
        # 12 MB declared, not one byte sent: a server that read the body would wait for it.
        sock.sendall(
            _head(
                "POST",
                f"{prefix}/v1/chat/completions",
                host,
                {
                    "Authorization": f"Bearer {key}",
                    "Content-Type": "application/json",
                    "Content-Length": str(12 * 1024 * 1024),
                },
            )
        )
        status, _, body = await asyncio.to_thread(_read_response, sock)
    assert status == 413, body
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]


async def test_a_chunked_oversized_body_is_refused_as_it_streams(
    guarded: str, store: Store, org: str
) -> None:
    key = await _key(store, org)
    sock, host, prefix = _open(guarded)
    with sock:
        sock.sendall(
            _head(
                "POST",
                f"{prefix}/v1/chat/completions",
                host,
                {
                    "Authorization": f"Bearer {key}",
                    "Content-Type": "application/json",
                    "Transfer-Encoding": "chunked",
                },
            )
        )
        piece = b"x" * 16384
        sent = 0
        try:
            while sent <= 4 * LIMIT:  # past the limit, and never a last chunk
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: the answer is still there to read
        status, _, body = await asyncio.to_thread(_read_response, sock)
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "request_too_large"


# --- concurrency per key ------------------------------------------------------------------------


async def test_one_key_over_its_concurrency_limit_gets_429(
    guarded: str, store: Store, org: str
) -> None:
    key = await _key(store, org, "busy")
    other = await _key(store, org, "other")
    body = json.dumps(_chat()).encode()
    sock, host, prefix = _open(guarded)
    with sock:
        # The first request is in flight while its body is half sent.
        sock.sendall(
            _head(
                "POST",
                f"{prefix}/v1/chat/completions",
                host,
                {
                    "Authorization": f"Bearer {key}",
                    "Content-Type": "application/json",
                    "Content-Length": str(len(body)),
                },
            )
            + body[:5]
        )
        async with httpx2.AsyncClient(base_url=guarded, timeout=60) as http:
            auth = {"Authorization": f"Bearer {key}"}
            refused = None
            for _ in range(100):  # until the held request has reached the ingress
                r = await http.get("/v1/models", headers=auth)
                if r.status_code == 429:
                    refused = r
                    break
                assert r.status_code == 200, r.text
                await asyncio.sleep(0.1)
            assert refused is not None, "the key was never over its limit"
            _error(refused, 429, "too_many_concurrent_requests")
            assert refused.headers["retry-after"] == "3"
            # Another key is not held back by this one.
            r = await http.get("/v1/models", headers={"Authorization": f"Bearer {other}"})
            assert r.status_code == 200, r.text
            # The held request completes, and frees the key's slot.
            sock.sendall(body[5:])
            status, _, answer = await asyncio.to_thread(_read_response, sock)
            assert status == 200, answer
            assert (await http.get("/v1/models", headers=auth)).status_code == 200


# --- the LLM's bounded line ---------------------------------------------------------------------


async def _until(check: Any, what: str, tries: int = 1200) -> None:
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"never: {what}")


LONG = _chat(400, "Count from 1 to 400, one number per line.")


async def test_an_llm_request_over_capacity_is_refused_at_once(
    guarded: str, store: Store, org: str
) -> None:
    """``max_waiting=1``: while the replica generates one request and another waits, the
    next gets 503 ``model_overloaded`` with Retry-After instead of waiting; the two are then
    served in turn, and after them one more."""
    keys = [f"Bearer {await _key(store, org, n)}" for n in ("a", "b", "c")]
    llm = ray_serve.get_deployment_handle(LLM_NAME, app_name=APP)
    before = await llm.load.remote()

    async def load() -> dict[str, Any]:
        return dict(await llm.load.remote())

    async with httpx2.AsyncClient(base_url=guarded, timeout=300) as http:

        def chat(body: dict[str, Any], key: str) -> Any:
            return asyncio.ensure_future(
                http.post("/v1/chat/completions", json=body, headers={"Authorization": key})
            )

        first = chat(LONG, keys[0])
        await _until(lambda: _is(load, generating=1), "the first request generates")
        second = chat(_chat(), keys[1])
        await _until(lambda: _is(load, waiting=1), "the second request waits")
        assert not first.done() and not second.done()
        r = await http.post(
            "/v1/chat/completions", json=_chat(), headers={"Authorization": keys[2]}
        )
        body = _error(r, 503, "model_overloaded")
        assert body["error"]["type"] == "server_error"
        assert r.headers["retry-after"] == "3"
        for waited in (await first, await second):
            assert waited.status_code == 200, waited.text
        after = await load()
        assert after["refused"] == before["refused"] + 1
        assert after["served"] == before["served"] + 2
        assert (after["in_flight"], after["waiting"]) == (0, 0)
        r = await http.post(
            "/v1/chat/completions", json=_chat(), headers={"Authorization": keys[2]}
        )
        assert r.status_code == 200, r.text


async def test_a_request_whose_caller_leaves_the_line_is_not_run(
    guarded: str, store: Store, org: str
) -> None:
    """A client that gives up while its request waits (a timeout, a closed connection)
    takes the request out of the line: it is never generated for nobody."""
    keys = [f"Bearer {await _key(store, org, n)}" for n in ("x", "y")]
    llm = ray_serve.get_deployment_handle(LLM_NAME, app_name=APP)

    async def load() -> dict[str, Any]:
        return dict(await llm.load.remote())

    before = await load()
    async with (
        httpx2.AsyncClient(base_url=guarded, timeout=300) as http,
        httpx2.AsyncClient(base_url=guarded, timeout=300) as leaving,
    ):
        first = asyncio.ensure_future(
            http.post("/v1/chat/completions", json=LONG, headers={"Authorization": keys[0]})
        )
        await _until(lambda: _is(load, generating=1), "the first request generates")
        gone = asyncio.ensure_future(
            leaving.post("/v1/chat/completions", json=_chat(), headers={"Authorization": keys[1]})
        )
        await _until(lambda: _is(load, waiting=1), "the second request waits")
        gone.cancel()
        await leaving.aclose()  # the connection closes: Serve cancels the request
        await _until(lambda: _is(load, waiting=0), "the abandoned request leaves the line")
        assert (await load())["generating"] == 1 and not first.done()
        done = await first
        assert done.status_code == 200, done.text
    after = await load()
    assert after["served"] == before["served"] + 1  # the abandoned one was never generated
    assert after["in_flight"] == 0


async def _is(load: Any, **expected: int) -> bool:
    now = await load()
    return all(now[k] == v for k, v in expected.items())


def test_llm_capacity_settings_are_checked() -> None:
    assert LlmConfig().max_ongoing_requests == 2 * (1 + LlmConfig().max_waiting)
    assert LlmConfig(max_waiting=3).max_ongoing_requests == 8
    given = LlmConfig(max_waiting=3, deployment=DeploymentOptions(max_ongoing_requests=5))
    assert given.max_ongoing_requests == 5
    with pytest.raises(pydantic.ValidationError, match=r"must exceed 1 \+ llm\.max_waiting"):
        LlmConfig(max_waiting=8, deployment=DeploymentOptions(max_ongoing_requests=9))
    with pytest.raises(pydantic.ValidationError):
        DeploymentOptions(autoscaling_config={"min_replicas": 2, "max_replicas": 1})
    with pytest.raises(pydantic.ValidationError):
        IngressConfig(max_concurrent_per_key=0)
