"""The OpenAI-compatible HTTP front door of the model deployments (a FastAPI ingress).

Routes: ``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/embeddings``,
``POST /v1/chat/completions`` (JSON, or server-sent ``data:`` chunks ending with
``data: [DONE]``), ``POST /v1/rerank`` (the Cohere/Jina shape vLLM serves, plus
``reranker``: which one ran) and ``GET /health`` (each model's availability). Bodies are
validated strictly before any model runs; every refusal is OpenAI's error body (see
``serve/models/_openai.py``).

Guards (``IngressConfig``), before a body is read: bearer API keys from the API's key store
(401; on unless Serve binds only to loopback), a body-size limit (413; ``Content-Length``
first, a chunked body counted as it streams) and per-key concurrency (429 with
``Retry-After``). ``/health`` stays open.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from cortex_ray import Principal, load_settings
from cortex_ray.observability import outgoing_traceparent
from cortex_ray.storage import Database, Store
from serve._errors import CorrelationMiddleware, correlated, openai_problem, report
from serve._tracing import TraceRequests
from serve.models._config import IngressConfig, ModelServingConfig
from serve.models._llm import ChatBackend, chat_backend
from serve.models._openai import (
    ChatCompletionRequest,
    EmbeddingsRequest,
    Failure,
    FailureError,
    RerankRequest,
    completion_id,
    now,
)
from serve.models._reranker import HandleReranker
from serve.models._spans import replica_tracing

try:
    from ray import serve as ray_serve
    from ray.serve import Deployment
    from ray.serve.exceptions import BackPressureError
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["INGRESS_NAME", "ModelIngress", "create_model_app"]

log = logging.getLogger("serve.models")

INGRESS_NAME = "ModelIngress"


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
_UNREADABLE = frozenset({"invalid_text", "string_unicode"})


def _param(loc: tuple[Any, ...]) -> str | None:
    """``input[2]`` or ``messages[0].role`` from a pydantic error location, without the
    union-branch tags pydantic adds (``str``, ``list[str]``, ``_RerankDocument``, ...)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, str) and part.endswith("[key]"):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_TAGS or "[" in part or part[:1].isupper() or part.startswith("_"):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return Failure(400, "the body is not valid JSON", code="invalid_json").response()
    unreadable = [e for e in errors if e.get("type") in _UNREADABLE]
    if unreadable:  # text no model can read: 422, as the API answers it
        param = _param(tuple(unreadable[0].get("loc", ())))
        message = f"{param}: {unreadable[0].get('msg')}" if param else "text cannot be read"
        return Failure(422, message, param=param, code="invalid_text").response()
    param = _param(tuple(first.get("loc", ())))
    kind = str(first.get("type", ""))
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    if kind == "missing":
        code = "missing_required_parameter"
    message = f"{param}: {first.get('msg', 'invalid')}" if param else str(first.get("msg"))
    return Failure(400, message, param=param, code=code).response()


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
        exc.status_code
    )
    message = str(exc.detail)
    if exc.status_code == 400 and "parsing the body" in message:  # not JSON (or not UTF-8)
        message, code = "the body is not valid JSON", "invalid_json"
    if exc.status_code == 413 and (limit := request.scope.get("starlette.max_body_size")):
        message = f"the request body is larger than this server accepts ({limit} bytes)"
    return Failure(exc.status_code, message, type=kind, code=code).response()


async def _on_failure(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FailureError)
    response = exc.failure.response()
    if exc.failure.status == 503 and exc.failure.code == "model_overloaded":
        response.headers["Retry-After"] = str(request.app.state.retry_after_s)
    return response


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    """Anything else: logged with its traceback under the correlation id (``report``)."""
    problem = report(exc, what=f"{request.method} {request.url.path}")
    return openai_problem(problem)


def _sse(item: dict[str, Any]) -> str:
    return f"data: {json.dumps(item, separators=(',', ':'))}\n\n"


def _overloaded_backpressure(model: str) -> Failure:
    return Failure(
        503,
        f"the model {model} is over capacity (every replica's queue is full); retry later",
        type="server_error",
        code="model_overloaded",
    )


# --- guards ----------------------------------------------------------------------------------


def serve_binds_loopback_only() -> bool:
    """Whether Serve's HTTP proxy listens on a loopback address only (127.0.0.1, ::1,
    localhost). False when it binds beyond, and when that cannot be told (fail closed)."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        host = None if client is None else str(client.http_config.host)
    except Exception:  # no controller, or not inside Ray: assume exposed
        log.warning("cannot read Serve's HTTP host; the model routes require API keys")
        return False
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyStore:
    """The API's key store (``Store.principal_for_api_key`` over the ``api_keys`` table),
    opened on first use from the replica's settings (``CORTEX_DATABASE_URL``); it checks
    the schema but never migrates it: the API owns that."""

    def __init__(self) -> None:
        self._db: Database | None = None
        self._store: Store | None = None
        self._opening = asyncio.Lock()

    async def principal(self, key: str) -> Principal | None:
        async with self._opening:
            if self._store is None:
                settings = load_settings().model_copy(
                    update={"migrate": False, "pool_min_size": 1, "pool_max_size": 4}
                )
                self._db = await Database.open(settings.storage)
                self._store = Store(self._db)
        return await self._store.principal_for_api_key(key)

    async def aclose(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = self._store = None


class _GuardedApp(FastAPI):
    """FastAPI behind the ingress guards: every route but ``/health`` passes, in this
    order and before its body is read, the declared body size (413), the bearer key (401)
    and the key's concurrency (429 with ``Retry-After``). A chunked body is counted as it
    streams, by FastAPI's ``max_body_size`` (its 413 is rendered by ``_on_http``)."""

    guard_limits: IngressConfig
    keys: KeyStore | None  # None: no keys asked for (loopback only, or switched off)
    _in_flight: dict[str, int]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Every answer, the guards' too, carries the request's correlation id.
        async with correlated(scope, send) as send_with_id:
            await self._guarded(scope, receive, send_with_id)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        route = path[len(root) :] if root and path.startswith(root) else path
        if route == "/health":
            await super().__call__(scope, receive, send)
            return
        limits = self.guard_limits
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            refusal = Failure(
                413,
                f"the request body is larger than this server accepts "
                f"({limits.max_body_bytes} bytes)",
                code="request_too_large",
            )
            await refusal.response()(scope, receive, send)
            return
        if self.keys is None:
            await super().__call__(scope, receive, send)
            return
        slot = await self._authenticate(headers)
        if isinstance(slot, JSONResponse):
            await slot(scope, receive, send)
            return
        # Counted in this replica's memory, so per replica: a cluster-wide count would put a
        # shared counter (an actor, a row) on every request (docs/model_serving.md, "Guards").
        if self._in_flight.get(slot, 0) >= limits.max_concurrent_per_key:
            busy = Failure(
                429,
                f"this API key has {limits.max_concurrent_per_key} requests in flight, the "
                "most it may; retry when one has finished",
                type="rate_limit_error",
                code="too_many_concurrent_requests",
            ).response()
            busy.headers["Retry-After"] = str(limits.retry_after_s)
            await busy(scope, receive, send)
            return
        self._in_flight[slot] = self._in_flight.get(slot, 0) + 1
        try:
            await super().__call__(scope, receive, send)
        finally:
            left = self._in_flight[slot] - 1
            if left:
                self._in_flight[slot] = left
            else:
                del self._in_flight[slot]

    async def _authenticate(self, headers: Headers) -> str | JSONResponse:
        """The key's concurrency slot (its digest), or the 401 / 503 to answer."""
        assert self.keys is not None
        scheme, _, key = headers.get("authorization", "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return _unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
        try:
            principal = await self.keys.principal(key)
        except Exception:  # the database: logged here, not shown
            log.exception("the key store could not be read")
            return Failure(
                503,
                "the key store is unavailable; retry later",
                type="server_error",
                code="key_store_unavailable",
            ).response()
        if principal is None:
            return _unauthenticated("invalid API key (unknown or revoked)", invalid=True)
        return hashlib.sha256(key.encode()).hexdigest()


def _unauthenticated(message: str, *, invalid: bool = False) -> JSONResponse:
    response = Failure(401, message, code="invalid_api_key").response()
    response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return response


def create_model_app(
    config: ModelServingConfig,
    *,
    embedder: DeploymentHandle[Any] | None,
    reranker: DeploymentHandle[Any] | None,
    llm: DeploymentHandle[Any] | None,
    require_keys: bool | None = None,
) -> FastAPI:
    """The FastAPI app over the deployments' handles (``None``: not deployed).

    ``require_keys``: the resolved ``config.ingress.require_keys`` (``None``: resolve it
    here, from where Serve's proxy binds).
    """
    limits = config.ingress
    if require_keys is None:
        require_keys = limits.require_keys
    if require_keys is None:
        require_keys = not serve_binds_loopback_only()
    keys = KeyStore() if require_keys else None
    chat: ChatBackend | None = (
        chat_backend(config.llm.backend, llm) if llm is not None and config.llm else None
    )
    created = now()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if keys is not None:
                await keys.aclose()

    app = _GuardedApp(
        title="cortex-ray models",
        docs_url="/docs",
        redoc_url=None,
        lifespan=lifespan,
        max_body_size=limits.max_body_bytes,
    )
    app.guard_limits = limits
    app.keys = keys
    app._in_flight = {}
    app.state.retry_after_s = limits.retry_after_s
    if keys is None:
        log.info("model routes open without API keys (Serve binds to loopback only)")
    else:
        log.info("model routes require API keys (the API's key store)")
    app.add_middleware(TraceRequests, prefix="/v1/")
    app.add_middleware(CorrelationMiddleware, render=openai_problem)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(FailureError, _on_failure)
    app.add_exception_handler(Exception, _on_unexpected)

    dims: list[int] = []

    async def embedding_dim() -> int:
        assert embedder is not None
        if not dims:
            dims.append(int((await embedder.info.remote())["dim"]))
        return dims[0]

    rerankers: list[HandleReranker] = []

    async def core_reranker() -> HandleReranker:
        """The deployment behind the core's ``Reranker`` interface (read once): the route
        reranks through the same seam knowledge search does."""
        assert reranker is not None
        if not rerankers:
            rerankers.append(await HandleReranker.connect(reranker))
        return rerankers[0]

    async def reranker_state() -> dict[str, Any] | None:
        if reranker is None or config.reranker is None:
            return None
        state: dict[str, Any] = await reranker.health.remote()
        return state

    def check_model(model: str, served: str | None) -> None:
        if served is None or model != served:
            raise FailureError(Failure.unknown_model(model, config.model_ids()))

    def check_text(text: str, param: str) -> None:
        if not text:
            raise FailureError(Failure(400, f"{param} is empty", param=param, code="empty_input"))
        if len(text) > limits.max_input_chars:
            raise FailureError(
                Failure(
                    400,
                    f"{param} has {len(text)} characters; at most {limits.max_input_chars} "
                    "are accepted",
                    param=param,
                    code="input_too_long",
                )
            )

    def check_count(n: int, limit: int, param: str) -> None:
        if n == 0:
            raise FailureError(Failure(400, f"{param} is empty", param=param, code="empty_input"))
        if n > limit:
            raise FailureError(
                Failure(
                    400,
                    f"{param} has {n} items; at most {limit} are accepted",
                    param=param,
                    code="too_many_inputs",
                )
            )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        models: dict[str, Any] = {}
        if embedder is not None and config.embedder:
            models[config.embedder.model_id] = {
                "kind": "embedding",
                **await embedder.health.remote(),
            }
        if (state := await reranker_state()) is not None:
            models[state["model_id"]] = {"kind": "rerank", **state}
        if llm is not None and config.llm:
            models[config.llm.served_id] = {
                "kind": "chat",
                "model_id": config.llm.served_id,
                "backend": config.llm.backend,
                "available": True,
                "reason": None,
            }
        return {"status": "ok", "keys_required": keys is not None, "models": models}

    async def model_cards() -> list[dict[str, Any]]:
        ids = []
        if embedder is not None and config.embedder:
            ids.append(config.embedder.model_id)
        if (state := await reranker_state()) is not None and state["available"]:
            ids.append(state["model_id"])
        if llm is not None and config.llm:
            ids.append(config.llm.served_id)
        return [
            {"id": i, "object": "model", "created": created, "owned_by": "cortex-ray"} for i in ids
        ]

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": await model_cards()})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> JSONResponse:
        for card in await model_cards():
            if card["id"] == model:
                return JSONResponse(card)
        raise FailureError(Failure.unknown_model(model, config.model_ids()))

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest) -> Response:
        check_model(body.model, config.embedder.model_id if embedder and config.embedder else None)
        assert embedder is not None
        raw = body.input
        if isinstance(raw, list) and raw and not all(isinstance(x, str) for x in raw):
            raise FailureError(
                Failure(
                    400,
                    "token arrays are not supported here; send the text",
                    param="input",
                    code="invalid_value",
                )
            )
        texts: list[str] = [raw] if isinstance(raw, str) else [str(x) for x in raw]
        check_count(len(texts), limits.max_embedding_inputs, "input")
        for i, text in enumerate(texts):
            check_text(text, "input" if isinstance(raw, str) else f"input[{i}]")
        if body.dimensions is not None and body.dimensions != (dim := await embedding_dim()):
            raise FailureError(
                Failure(
                    400,
                    f"this model has {dim} dimensions and cannot shorten them",
                    param="dimensions",
                    code="unsupported_parameter",
                )
            )
        vectors, tokens = await embedder.embed_with_usage.remote(
            texts, traceparent=outgoing_traceparent()
        )
        data: list[dict[str, Any]] = []
        for i, row in enumerate(vectors):
            value: Any = (
                base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()
                if body.encoding_format == "base64"
                else row.tolist()
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.post("/v1/rerank")
    async def rerank(body: RerankRequest) -> Response:
        served = config.reranker.model_id if reranker and config.reranker else None
        check_model(body.model, served)
        assert reranker is not None
        check_text(body.query, "query")
        docs = body.texts()
        check_count(len(docs), limits.max_rerank_documents, "documents")
        for i, doc in enumerate(docs):
            if len(doc) > limits.max_input_chars:
                check_text(doc, f"documents[{i}]")
        seam = await core_reranker()
        if not seam.available:
            failure = Failure.unavailable(f"the reranker {body.model!r}", str(seam.reason))
            log.warning("rerank refused: %s", failure.message)
            raise FailureError(failure)
        hits = await seam.rerank(body.query, docs, body.top_n)
        results = [
            {
                "index": hit.index,
                "relevance_score": hit.score,
                **({"document": {"text": docs[hit.index]}} if body.return_documents else {}),
            }
            for hit in hits
        ]
        return JSONResponse(
            {
                "id": completion_id("rerank"),
                "model": body.model,
                "reranker": seam.name,
                "usage": {"total_tokens": 0},
                "results": results,
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        check_model(body.model, config.llm.served_id if chat and config.llm else None)
        assert chat is not None
        check_count(len(body.messages), limits.max_messages, "messages")
        for i, m in enumerate(body.messages):
            if (text := m.text()) and len(text) > limits.max_input_chars:
                check_text(text, f"messages[{i}].content")
        if (limit := body.token_limit()) is not None and limit > limits.max_completion_tokens:
            param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            raise FailureError(
                Failure(
                    400,
                    f"{param} is {limit}; at most {limits.max_completion_tokens} are accepted",
                    param=param,
                    code="invalid_value",
                )
            )
        assert config.llm is not None
        try:
            if not body.stream:
                result = await chat.chat(body)
                if isinstance(result, Failure):
                    raise FailureError(result)
                return JSONResponse(result)
            stream = chat.chat_stream(body)
            first = await anext(stream, None)
        except BackPressureError:  # every replica full and the caller's queue too
            raise FailureError(_overloaded_backpressure(config.llm.served_id)) from None
        if isinstance(first, Failure):
            raise FailureError(first)

        async def events() -> AsyncIterator[str]:
            try:
                if first is not None:
                    yield _sse(first)
                async for item in stream:
                    if isinstance(item, Failure):
                        yield _sse(item.body())
                        break
                    yield _sse(item)
                yield "data: [DONE]\n\n"
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class _ModelIngressReplica:
    """The ingress deployment: the FastAPI app is built in the replica around the handles
    Serve passes to its constructor."""

    def __init__(
        self,
        config: ModelServingConfig,
        embedder: DeploymentHandle[Any] | None = None,
        reranker: DeploymentHandle[Any] | None = None,
        llm: DeploymentHandle[Any] | None = None,
    ) -> None:
        self._config = config
        self._tracing = replica_tracing(config.spans_database_url)
        self._handles = {"embedder": embedder, "reranker": reranker, "llm": llm}
        required = config.ingress.require_keys
        self._require_keys = not serve_binds_loopback_only() if required is None else required

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_model_app(
            self._config,
            embedder=self._handles["embedder"],
            reranker=self._handles["reranker"],
            llm=self._handles["llm"],
            require_keys=self._require_keys,
        )

    def config(self) -> ModelServingConfig:
        """What this app serves (``ModelHandles.connect`` reads it through a handle)."""
        return self._config


ModelIngress: Deployment = ray_serve.deployment(name=INGRESS_NAME)(
    ray_serve.ingress()(_ModelIngressReplica)
)
"""``ModelIngress.bind(config, embedder=..., reranker=..., llm=...)``."""
