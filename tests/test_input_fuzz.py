"""Bad input to every field of every route of both apps, derived from their OpenAPI documents
(a new route or field is covered without editing this file).

For each operation: a request built from its schema (required fields filled with plain
values, the organisation and row ids pinned to real ones so requests reach past the
lookups), then one field at a time (path, query, and every string or number of the body,
nested ones included) replaced by what a careless or hostile client sends: a lone
surrogate (as a JSON escape), a NUL, a megabyte of text (bodies; a URL carries the longest
the client sends, 30,000 characters), a surrogate's UTF-8 bytes percent-encoded, and for
numbers a numeral in a string, a boolean, a huge and a negative number.

Every answer: no 5xx; an error is JSON of bounded size in the one error shape, with the
correlation id in the body and the header. And the rules of docs/api.md hold on every
route of the API: a NUL or a lone surrogate in any string of a body is refused with 422
naming that field, and so is a number sent as a string ("3"): one rule for numbers on
every route. Names of addressable objects are in the core's safe set (``../`` refused).

The API runs in-process (ASGI) on the test database with a scripted model, as
``test_api``'s in-process fuzzer builds it; the model app is deployed on real Ray Serve
(packaged MiniLM as embedder and cross-encoder, packaged SmolLM2 through llama.cpp) and
reached through Serve's HTTP proxy, where the reported crash happened.
"""

from __future__ import annotations

import copy
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest

from cortex_ray import NAME_PATTERN, AgentMode, Grant, Principal, Runtime, Settings
from cortex_ray.governance import WorkflowVersionSpec
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder, ScriptedModelClient, packaged_minilm_path
from cortex_ray.storage import Database, Store
from serve import ApiOptions, create_app

MAX_ERROR_BYTES = 8 * 1024
"""An error body is never bigger than this, whatever the request held."""

MEGABYTE = "x" * (1 << 20)
LONG_URL_PART = "y" * 30_000
SURROGATE = "a\ud800b"
NUL = "a\x00b"

STRING_VALUES: dict[str, Any] = {"surrogate": SURROGATE, "nul": NUL, "megabyte": MEGABYTE}
NUMBER_VALUES: dict[str, Any] = {
    "numeral": "3",
    "boolean": True,
    "huge": 10**30,
    "negative": -1,
    "float": 1e308,
}
URL_STRING_VALUES = {"nul": "a%00b", "surrogate-bytes": "a%ED%A0%80b", "long": LONG_URL_PART}
URL_NUMBER_VALUES = {"huge": "1" * 40, "negative": "-1", "nan": "NaN", "float": "1e308"}


# --- requests from an OpenAPI document ---------------------------------------------------------


class Spec:
    """An OpenAPI document: ``$ref``s resolved, plain values for a schema."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < 32:
            node: Any = self.document
            for part in schema["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    def options(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The alternatives of an ``anyOf``/``oneOf`` (the schema itself if none), nulls
        last."""
        schema = self.resolve(schema)
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        if not alternatives:
            return [schema]
        resolved = [self.resolve(a) for a in alternatives]
        return sorted(resolved, key=lambda a: a.get("type") == "null")

    def kind(self, schema: dict[str, Any]) -> str | None:
        """``string``, ``integer``, ``number``, ``object``, ``array``, ``boolean`` or None."""
        first = self.options(schema)[0]
        kind = first.get("type")
        if kind is None and "properties" in first:
            return "object"
        if kind is None and "enum" in first:
            return "string"
        return kind if isinstance(kind, str) else None

    def example(self, schema: dict[str, Any], depth: int = 0) -> Any:
        """A plain value the schema accepts, as far as a plain value can."""
        option = self.options(schema)[0]
        if "const" in option:
            return option["const"]
        if "enum" in option:
            return option["enum"][0]
        if "default" in option and option["default"] is not None:
            return option["default"]
        kind = self.kind(option)
        if kind == "string":
            fmt = option.get("format")
            if fmt == "uuid":
                return str(uuid.uuid4())
            if fmt == "date-time":
                return datetime.now(UTC).isoformat()
            return "x1"
        if kind == "integer":
            return max(1, int(option.get("minimum", 1)))
        if kind == "number":
            return max(1.0, float(option.get("minimum", option.get("exclusiveMinimum", 0)) + 1))
        if kind == "boolean":
            return False
        if kind == "array":
            n = int(option.get("minItems", 0))
            return [self.example(option.get("items", {}), depth + 1) for _ in range(n)]
        if kind == "object" and depth < 8:
            props = option.get("properties", {})
            return {
                name: self.example(props[name], depth + 1)
                for name in option.get("required", [])
                if name in props
            }
        return {} if kind == "object" else None

    def leaves(
        self, schema: dict[str, Any], path: tuple[str | int, ...] = (), depth: int = 0
    ) -> Iterator[tuple[tuple[str | int, ...], str]]:
        """Every string and number field of a body (``(path, kind)``), nested ones and the
        first item of arrays included; free-form objects get one string value."""
        if depth > 6:
            return
        option = self.options(schema)[0]
        kind = self.kind(option)
        if kind == "string" and any(k in option for k in ("enum", "const", "pattern")):
            yield path, "choice"  # a string with a rule of its own (one of, a pattern)
        elif kind in ("string", "integer", "number"):
            yield path, kind
        elif kind == "array":
            yield from self.leaves(option.get("items", {}), (*path, 0), depth + 1)
        elif kind == "object":
            props = option.get("properties")
            if props:
                for name, sub in props.items():
                    yield from self.leaves(sub, (*path, name), depth + 1)
            elif option.get("additionalProperties", True) is not False:
                yield (*path, "free_key"), "string"


def put(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """``body`` with ``value`` at ``path`` (containers created on the way)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(body) if isinstance(body, list) else []
        nxt = items[0] if items else ({} if rest and isinstance(rest[0], str) else [])
        return [put(nxt, rest, value), *items[1:]]
    out = dict(body) if isinstance(body, dict) else {}
    default: Any = [] if rest and isinstance(rest[0], int) else {}
    out[head] = put(out.get(head, default), rest, value)
    return out


@dataclass
class Case:
    """One request: an operation with one field replaced."""

    operation: str
    method: str
    path: str
    params: dict[str, str]
    body: Any
    has_body: bool
    where: str  # "path", "query" or "body"
    field: tuple[str | int, ...]
    value_name: str
    kind: str

    def url(self) -> str:
        return self.path.format(**self.params)


@dataclass
class Operation:
    op_id: str
    method: str
    path: str
    path_params: dict[str, dict[str, Any]]
    query: dict[str, dict[str, Any]]  # every query parameter
    required_query: list[str]
    body_schema: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)


def operations(spec: Spec) -> list[Operation]:
    out = []
    for path, item in spec.document["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            params = [spec.resolve(p) for p in op.get("parameters", [])]
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            out.append(
                Operation(
                    op_id=op.get("operationId", f"{method} {path}"),
                    method=method.upper(),
                    path=path,
                    path_params={p["name"]: p["schema"] for p in params if p["in"] == "path"},
                    query={p["name"]: p["schema"] for p in params if p["in"] == "query"},
                    required_query=[
                        p["name"] for p in params if p["in"] == "query" and p.get("required")
                    ],
                    body_schema=None if body is None else body["schema"],
                )
            )
    return out


def cases(spec: Spec, pinned: dict[str, str]) -> Iterator[Case]:
    """Every operation with one field at a time replaced by each bad value."""
    for op in operations(spec):
        params = {
            name: pinned.get(name) or str(spec.example(schema))
            for name, schema in op.path_params.items()
        }
        query = {name: str(spec.example(op.query[name])) for name in op.required_query}
        body = None if op.body_schema is None else spec.example(op.body_schema)

        def case(
            where: str,
            at: tuple[str | int, ...],
            value_name: str,
            kind: str,
            op: Operation = op,
            params: dict[str, str] = params,
            body: Any = body,
        ) -> Case:
            return Case(
                op.op_id, op.method, op.path, dict(params), copy.deepcopy(body),
                op.body_schema is not None, where, at, value_name, kind,
            )  # fmt: skip

        yield case("none", (), "plain", "none")  # the request as built: every operation
        for name, schema in op.path_params.items():
            kind = spec.kind(schema) or "string"
            values = URL_NUMBER_VALUES if kind in ("integer", "number") else URL_STRING_VALUES
            for value_name, value in values.items():
                c = case("path", (name,), value_name, kind)
                c.params[name] = value
                yield c
        for name, schema in op.query.items():
            kind = spec.kind(schema) or "string"
            values = URL_NUMBER_VALUES if kind in ("integer", "number") else URL_STRING_VALUES
            for value_name, value in values.items():
                c = case("query", (name,), value_name, kind)
                c.params = {**params, "?query": json.dumps({**query, name: value})}
                yield c
        if op.body_schema is None:
            continue
        for at, kind in spec.leaves(op.body_schema):
            values = NUMBER_VALUES if kind in ("integer", "number") else STRING_VALUES
            for value_name, value in values.items():
                c = case("body", at, value_name, kind)
                if at and at[-1] == "free_key":  # a free-form object: the key and its value
                    c.body = put(body, at[:-1], {value: value})
                else:
                    c.body = put(body, at, value)
                yield c


async def send(client: httpx2.AsyncClient, case: Case, headers: dict[str, str]) -> httpx2.Response:
    params = dict(case.params)
    query_json = params.pop("?query", None)
    url = case.path.format(**params)
    if query_json is not None:
        query = json.loads(query_json)
        # percent-escapes in URL values are meant as sent: build the query string by hand
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    content = None
    if case.has_body:
        # ensure_ascii: a lone surrogate travels as its JSON escape, as a client sends it
        content = json.dumps(case.body, ensure_ascii=True).encode()
        headers = {**headers, "content-type": "application/json"}
    return await client.request(case.method, url, content=content, headers=headers)


def names(error_loc: list[Any], loc: list[Any]) -> bool:
    """Whether a validation error's location names the field at ``loc``: the field itself
    or inside it, or the body field (at least) that holds it (an item validated whole)."""
    if error_loc[: len(loc)] == loc:
        return True
    return len(error_loc) >= 2 and loc[: len(error_loc)] == error_loc


def check_answer(case: Case, r: httpx2.Response) -> list[str]:
    """What is wrong with an answer (nothing: [])."""
    what = f"{case.method} {case.path} {case.where}:{case.field} = {case.value_name}"
    problems = []
    if r.status_code >= 500:
        problems.append(f"{what}: {r.status_code} {r.text[:300]}")
    if r.status_code < 400:
        return problems
    if len(r.content) > MAX_ERROR_BYTES:
        problems.append(f"{what}: a {len(r.content)}-byte error body")
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return [*problems, f"{what}: not the error body: {r.text[:300]!r}"]
    cid = error.get("correlationId")
    if not cid or r.headers.get("x-correlation-id") != cid:
        problems.append(f"{what}: no correlation id in body and header: {r.text[:300]}")
    if not error.get("message") or not error.get("code"):
        problems.append(f"{what}: no message or code: {r.text[:300]}")
    return problems


# --- the API -----------------------------------------------------------------------------------


def _respond(request: Any) -> str:
    props = (request.response_schema or {}).get("properties", {})
    if "candidates" in props:
        return json.dumps({"candidates": [{"finish": True, "message": "done", "rationale": "r"}]})
    if "scores" in props:
        return json.dumps({"scores": [5] * int(props["scores"].get("maxItems", 1))})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    return "ok"


@dataclass
class ApiEstate:
    client: httpx2.AsyncClient
    key: str
    pinned: dict[str, str]


@pytest.fixture
async def api(settings: Settings, db: Database, store: Store, org: str) -> AsyncIterator[ApiEstate]:
    runtime = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash", "candidates": 1}),
        model=ScriptedModelClient(responder=_respond),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )
    try:
        await store.ensure_org(org)
        admin = Principal(
            id="admin", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"}))
        )
        key, _ = await store.create_api_key(admin, "fuzz")
        worker = await runtime.create_agent(org, "fuzz-worker", mode=AgentMode.AUTONOMOUS)
        chat = await runtime.create_agent(org, "fuzz-chat")
        session = await runtime.open_session(org, chat.id, admin)
        await runtime.workflows.create(org, "fuzz-flow")
        await runtime.workflows.publish(
            org, "fuzz-flow", WorkflowVersionSpec(instructions="read the clock")
        )
        app = create_app(runtime, options=ApiOptions(max_body_bytes=4 << 20))
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
            yield ApiEstate(
                client,
                key,
                {
                    "org": org,
                    "agent_ref": str(worker.id),
                    "session_id": str(session.id),
                    "workflow": "fuzz-flow",
                },
            )
    finally:
        await runtime.close(close_db=False)


async def test_bad_text_and_numbers_on_every_api_route_get_the_error_body(
    api: ApiEstate,
) -> None:
    spec = Spec((await api.client.get("/openapi.json")).json())
    auth = {"Authorization": f"Bearer {api.key}"}
    problems: list[str] = []
    refused: list[str] = []  # bodies the API accepted although docs/api.md says it refuses
    sent = 0
    seen_ops = set()
    for case in cases(spec, api.pinned):
        r = await send(api.client, case, auth)
        sent += 1
        seen_ops.add(case.operation)
        problems += check_answer(case, r)
        if case.where != "body" or case.value_name not in ("surrogate", "nul", "numeral"):
            continue
        # docs/api.md: text without NUL or lone surrogates everywhere, numbers as numbers
        loc = ["body", *case.field]
        if case.field and case.field[-1] == "free_key":
            loc = loc[:-1]
        details = r.json()["error"].get("details", []) if r.status_code == 422 else []
        if not any(names(d["loc"], loc) for d in details):
            refused.append(f"{case.method} {case.path} {loc} = {case.value_name}: {r.status_code}")
    assert problems == [], "\n".join(problems[:40])
    assert refused == [], "\n".join(refused[:40])
    assert len(seen_ops) == len(operations(spec)) > 60
    assert sent > 1000


# --- names ---------------------------------------------------------------------------------------


async def test_names_of_addressable_objects_are_in_the_safe_set(api: ApiEstate) -> None:
    """Every body field named ``name`` of a route that creates something, derived from the
    OpenAPI document: a name outside the safe set is refused, a safe one is addressable."""
    spec = Spec((await api.client.get("/openapi.json")).json())
    auth = {"Authorization": f"Bearer {api.key}"}
    org = api.pinned["org"]
    creating = [
        op
        for op in operations(spec)
        if op.method in ("POST", "PUT") and op.body_schema is not None
        and "name" in spec.resolve(op.body_schema).get("properties", {})
        and "name" in spec.resolve(op.body_schema).get("required", [])
    ]  # fmt: skip
    assert {op.op_id for op in creating} >= {"create_agent", "create_workflow"}
    for op in creating:
        schema = spec.resolve(spec.resolve(op.body_schema or {})["properties"]["name"])
        pattern = schema.get("pattern", "")
        # the core's safe set, or a narrower rule of the kind's own (workflows: lower case)
        assert pattern in (NAME_PATTERN, r"^[a-z0-9][a-z0-9_.-]{0,99}$"), (op.op_id, pattern)
        url = op.path.format(org=org)
        for bad in ("../../../../etc/passwd", "a b", "-rf", "a/b", ".hidden", "é", "x" * 129):
            body = put(spec.example(op.body_schema or {}), ("name",), bad)
            r = await api.client.request(op.method, url, json=body, headers=auth)
            assert r.status_code == 422, (op.op_id, bad, r.status_code, r.text)
            assert any(d["loc"] == ["body", "name"] for d in r.json()["error"]["details"])
    # a safe name is addressable by name in a path, as it is
    r = await api.client.post(f"/api/orgs/{org}/agents", json={"name": "Ops.bot_2-x"}, headers=auth)
    assert r.status_code == 201, r.text
    got = await api.client.get(f"/api/orgs/{org}/agents/Ops.bot_2-x", headers=auth)
    assert got.status_code == 200 and got.json()["id"] == r.json()["id"]


async def test_an_agent_with_an_old_unsafe_name_keeps_working_by_id(
    api: ApiEstate, db: Database
) -> None:
    """A row made before the rule: read and changed by its id; the core refuses such a name
    for a new agent whatever the door (here: Python)."""
    org = api.pinned["org"]
    auth = {"Authorization": f"Bearer {api.key}"}
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE agents SET name = %s WHERE org_id = %s AND id = %s",
            ("../old name", org, api.pinned["agent_ref"]),
        )
    url = f"/api/orgs/{org}/agents/{api.pinned['agent_ref']}"
    r = await api.client.get(url, headers=auth)
    assert r.status_code == 200 and r.json()["name"] == "../old name"
    r = await api.client.patch(url, json={"persona": "still here"}, headers=auth)
    assert r.status_code == 200 and r.json()["persona"] == "still here"


# --- the model app -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models_url(ray_cluster: Any) -> Iterator[str]:
    ray_serve = pytest.importorskip("ray.serve")
    from ray.serve.context import _get_global_client

    from serve.models import (
        DeploymentOptions,
        EmbedderConfig,
        IngressConfig,
        LlmConfig,
        ModelServingConfig,
        RerankerConfig,
        build_models_app,
    )

    no_cpu = DeploymentOptions(ray_actor_options={"num_cpus": 0})
    config = ModelServingConfig(
        embedder=EmbedderConfig(deployment=no_cpu),
        reranker=RerankerConfig(
            model_id="fuzz-reranker", model=str(packaged_minilm_path()), deployment=no_cpu
        ),
        llm=LlmConfig(
            model_id="SmolLM2-135M-Instruct", n_ctx=512, default_max_tokens=4, deployment=no_cpu
        ),
        ingress=IngressConfig(
            max_body_bytes=4 << 20, max_completion_tokens=8, require_keys=False, deployment=no_cpu
        ),
    )
    client = _get_global_client(raise_if_no_controller_running=False)
    started = client is None
    if started:
        ray_serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
        client = _get_global_client()
    assert client is not None
    port = int(client.http_config.port)
    ray_serve.run(build_models_app(config), name="cortex-fuzz-models", route_prefix="/fuzz-models")
    try:
        yield f"http://127.0.0.1:{port}/fuzz-models"
    finally:
        ray_serve.delete("cortex-fuzz-models")
        if started:
            ray_serve.shutdown()


async def test_bad_text_and_numbers_on_every_model_route_get_the_error_body(
    models_url: str,
) -> None:
    async with httpx2.AsyncClient(base_url=models_url, timeout=120) as client:
        spec = Spec((await client.get("/openapi.json")).json())
        served = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        pinned = {"model": served[-1]}
        problems: list[str] = []
        unreadable: list[str] = []
        sent = 0
        for case in cases(spec, pinned):
            if case.has_body and isinstance(case.body, dict) and case.field != ("model",):
                # the served model, so that a request reaches past the model check
                path = case.path
                case.body.setdefault("model", served[0] if "embed" in path else served[-1])
                if "rerank" in path:
                    case.body["model"] = "fuzz-reranker"
                if "chat" in path:
                    case.body.setdefault("max_tokens", 2)
                    if case.field[:1] != ("messages",):
                        case.body["messages"] = [{"role": "user", "content": "hi"}]
            r = await send(client, case, {})
            sent += 1
            problems += check_answer(case, r)
            if r.status_code >= 400 and "type" not in r.json().get("error", {}):
                problems.append(f"{case.path}: not in OpenAI's dialect: {r.text[:200]}")
            # free text (a value with its own rule, one of or a pattern, fails that rule)
            bad_text = case.kind == "string" and case.value_name in ("surrogate", "nul")
            bad_text = bad_text and case.where == "body"
            if bad_text and r.status_code != 422:
                unreadable.append(f"{case.path} {case.field}: {r.status_code} {r.text[:200]}")
        assert problems == [], "\n".join(problems[:40])
        assert unreadable == [], "\n".join(unreadable[:40])
        assert sent > 100
        # the reported cases, exactly
        for path, body in (
            ("/v1/embeddings", {"model": "a\ud800b", "input": "hello"}),
            ("/v1/embeddings", {"model": served[0], "input": "a\ud800b"}),
            ("/v1/chat/completions", {"model": "a\ud800b", "messages": []}),
        ):
            r = await client.post(
                path,
                content=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "invalid_text"
        r = await client.post("/v1/embeddings", json={"model": "m" * 100_000, "input": "hello"})
        assert r.status_code == 404 and len(r.content) < 1000, len(r.content)
        assert "(100000 characters)" in r.json()["error"]["message"]
