"""The chat model: this project's llama.cpp deployment on CPU, Ray Serve LLM (vLLM) on GPU.

Both are reached through a ``ChatBackend`` (``chat`` and ``chat_stream`` in the OpenAI
chat-completions format, as plain dicts), so the HTTP ingress and the in-cluster
``HandleModelClient`` never know which one runs:

- ``LlamaCppServer`` wraps the core's ``LlamaCppClient`` (the packaged SmolLM2 by default):
  tools and JSON schemas become a decoding grammar; text is streamed token by token; a tool
  call is sent as one delta once decoded.
- ``build_vllm_deployment`` builds Ray Serve LLM's ``LLMServer`` from ``LlmConfig.vllm``.
  ``ray.serve.llm`` is imported only there: without vLLM installed it raises ImportError.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import jsonschema
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)
from opentelemetry.trace import Status, StatusCode
from pydantic import SecretStr

from cortex_ray import ModelError
from cortex_ray.models import ChatMessage, ChatRequest, ChatResponse, ToolCall
from cortex_ray.models.llama_cpp import decode_tool_choice, tool_choice_schema
from cortex_ray.observability import outgoing_traceparent, server_span
from serve.models._config import LlmConfig
from serve.models._openai import ChatCompletionRequest, Failure, completion_id, now
from serve.models._spans import replica_tracing

try:
    from ray import serve as ray_serve
    from ray.serve import Application, Deployment
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = [
    "LLM_NAME",
    "ChatBackend",
    "LlamaCppDeployment",
    "LlamaCppServer",
    "PreparedChat",
    "build_vllm_deployment",
    "chat_backend",
    "to_core_request",
]

log = logging.getLogger("serve.models")

LLM_NAME = "LLM"

Chunk = dict[str, Any]


# --- OpenAI request → the core's ChatRequest -------------------------------------------------


def _unsupported(param: str, why: str) -> Failure:
    return Failure(
        400, f"'{param}' {why} on the llama.cpp backend", param=param, code="unsupported_parameter"
    )


def _check_schema(schema: dict[str, Any], param: str) -> Failure | None:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return Failure(
            400, f"invalid JSON schema: {exc.message}", param=param, code="invalid_value"
        )
    return None


@dataclass(frozen=True)
class PreparedChat:
    """The core's request, and whether its output is a forced ``{"tool", "arguments"}``."""

    request: ChatRequest
    forced_tool: bool = False


def _as_tool_call(response: ChatResponse) -> ChatResponse:
    # cut off at the token limit: the call as far as it got, finish_reason "length"
    return decode_tool_choice(response.content, response.finish_reason, response.usage)


def _forced_tool_request(
    req: ChatCompletionRequest,
    messages: list[ChatMessage],
    tools: tuple[dict[str, Any], ...],
    max_tokens: int,
) -> PreparedChat | Failure:
    """``tool_choice`` "required" or a named function: decode under a grammar that allows
    only calls (of that function)."""
    choice = req.tool_choice
    wanted = None if choice is None or isinstance(choice, str) else choice.function.get("name")
    chosen = tuple(t for t in tools if wanted is None or t["function"]["name"] == wanted)
    if not chosen:
        return Failure(
            400,
            f"tool_choice names {wanted!r}, which is not among the tools"
            if wanted
            else "tool_choice 'required' needs tools",
            param="tool_choice",
            code="invalid_value",
        )
    options = tool_choice_schema(chosen)["anyOf"][1:]  # the calls, without the reply
    lines = [
        'Answer by calling one tool, as {"tool": name, "arguments": {...}}. Tools:',
        *(f"- {t['function']['name']}: {t['function'].get('description', '')}" for t in chosen),
    ]
    return PreparedChat(
        ChatRequest(
            messages=(ChatMessage(role="system", content="\n".join(lines)), *messages),
            response_schema=options[0] if len(options) == 1 else {"anyOf": options},
            schema_name="tool_call",
            temperature=req.temperature,
            max_tokens=max_tokens,
        ),
        forced_tool=True,
    )


def to_core_request(req: ChatCompletionRequest, default_max_tokens: int) -> PreparedChat | Failure:
    """The core's ``ChatRequest`` for an OpenAI body, or why the llama.cpp backend refuses it
    (parameters it would silently ignore although they change the answer)."""
    if req.n not in (None, 1):
        return _unsupported("n", "must be 1")
    if req.top_p not in (None, 1.0):
        return _unsupported("top_p", "is not supported (use temperature)")
    if req.logprobs:
        return _unsupported("logprobs", "is not supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0.0):
            return _unsupported(name, "is not supported")
    messages = []
    for m in req.messages:
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in m.tool_calls or ()
        )
        role: Literal["system", "user", "assistant", "tool"] = (
            "system" if m.role == "developer" else m.role
        )
        messages.append(
            ChatMessage(role=role, content=m.text(), tool_calls=calls, tool_call_id=m.tool_call_id)
        )
    tools: tuple[dict[str, Any], ...] = ()
    if req.tools and req.tool_choice != "none":
        for i, tool in enumerate(req.tools):
            if tool.function.parameters is not None and (
                bad := _check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
            ):
                return bad
        tools = tuple(t.model_dump(exclude_none=True) for t in req.tools)
    max_tokens = req.token_limit() or default_max_tokens
    if req.tool_choice not in (None, "auto", "none"):
        return _forced_tool_request(req, messages, tools, max_tokens)
    schema: dict[str, Any] | None = None
    name = "output"
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        schema = {"type": "object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            return Failure(
                400,
                "response_format json_schema needs json_schema.schema",
                param="response_format.json_schema",
                code="invalid_value",
            )
        schema, name = fmt.json_schema.schema_, fmt.json_schema.name
        if bad := _check_schema(schema, "response_format.json_schema.schema"):
            return bad
    return PreparedChat(
        ChatRequest(
            messages=tuple(messages),
            tools=tools,
            response_schema=schema,
            schema_name=name,
            temperature=req.temperature,
            max_tokens=max_tokens,
            stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
            priority=req.priority,
        )
    )


def _failure_of(exc: ModelError) -> Failure:
    text = str(exc)
    if "exceed context window" in text:
        return Failure(400, text, param="messages", code="context_length_exceeded")
    return Failure(502, text, type="server_error", code="backend_error")


def _message(response: ChatResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": response.content, "refusal": None}
    if response.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in response.tool_calls
        ]
    return out


def _finish(reason: str | None, tool_calls: bool = False) -> str:
    if reason == "length":  # a call cut off too: its arguments are incomplete
        return "length"
    if tool_calls:
        return "tool_calls"
    return reason if reason in ("stop", "length") else "stop"


# --- the CPU deployment --------------------------------------------------------------------


def _kind(request: ChatRequest) -> str:
    """What a request is, for the counters: its schema's name, "tools" or "text"."""
    if request.response_schema is not None:
        return request.schema_name
    return "tools" if request.tools else "text"


def _overloaded(model: str, reason: str) -> Failure:
    return Failure(
        503,
        f"the model {model} is over capacity ({reason}); retry later",
        type="server_error",
        code="model_overloaded",
    )


class ModelLine:
    """One model, taken by one request at a time: waiters in order of (priority, arrival).

    An ``asyncio.Lock`` (what the line was) serves in arrival order only, so background
    importance rescorings queued before a run's next proposal made that run wait behind
    them. A waiter that goes away (cancelled, timed out) is skipped; one that was handed the
    model just as it went away hands it on."""

    def __init__(self) -> None:
        self._busy = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    def locked(self) -> bool:
        return self._busy

    async def acquire(self, priority: int = 0) -> None:
        if not self._busy and not self._waiters:
            self._busy = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # it was ours as we left: the next one's now
            raise

    def release(self) -> None:
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():  # a cancelled waiter left its entry behind
                waiter.set_result(None)
                return  # still busy: the model is the waiter's now
        self._busy = False


class LlamaCppServer:
    """A GGUF chat model (the packaged SmolLM2 by default) through the core's
    ``LlamaCppClient``; llama.cpp runs one generation at a time per replica.

    Requests wait for the model in order of ``priority``, then arrival (:class:`ModelLine`), at most
    ``config.max_waiting`` of them and each at most ``config.queue_timeout_s``; beyond
    either the request is answered 503 ``model_overloaded`` (a ``Failure``) without running.
    A caller that goes away while its request waits takes it out of the line; one that goes
    away mid-generation leaves the model busy until that generation ends (a stream stops at
    the next token; a whole completion runs to its token limit in its thread).

    Handle methods (OpenAI chat-completions dicts): ``chat(request) -> dict | Failure``,
    ``chat_stream(request)`` (a streaming generator of chunk dicts, or one ``Failure``),
    ``health() -> dict``, ``load() -> dict`` (requests in flight, waiting, served, refused).
    """

    def __init__(
        self, config: LlmConfig | None = None, *, spans_database_url: SecretStr | None = None
    ) -> None:
        from cortex_ray.models.llama_cpp import LlamaCppClient

        self._config = config or LlmConfig()
        self._tracing = replica_tracing(spans_database_url)
        self._client = LlamaCppClient(
            self._config.model_path,
            model_name=self._config.model_id,  # the packaged model of that name
            data_dir=self._config.data_dir,
            n_ctx=self._config.n_ctx,
            n_threads=self._config.n_threads,
            default_temperature=self._config.default_temperature,
            default_max_tokens=self._config.default_max_tokens,
        )
        self._model_free = ModelLine()
        self._in_flight = 0  # generating (0 or 1) + waiting
        self._served: Counter[str] = Counter()  # by kind: a schema's name, "tools" or "text"
        self._refused: Counter[str] = Counter()
        self._longest_wait_s = 0.0
        log.info("llm %s ready (llama.cpp, %s)", self._config.model_id, self._client.name)

    async def health(self) -> dict[str, Any]:
        return {"model_id": self._config.model_id, "available": True, "reason": None}

    async def load(self) -> dict[str, Any]:
        """This replica's line for the model, as counters."""
        generating = int(self._model_free.locked())
        return {
            "in_flight": self._in_flight,
            "generating": generating,
            "waiting": self._in_flight - generating,
            "max_waiting": self._config.max_waiting,
            "served": sum(self._served.values()),
            "refused": sum(self._refused.values()),
            "served_by_kind": dict(self._served),
            "refused_by_kind": dict(self._refused),
            "longest_wait_s": round(self._longest_wait_s, 3),
        }

    async def _admit(self, kind: str, priority: int = 0) -> Failure | None:
        """Take the model (waiting in line by ``priority``), or say why not; ``_leave``
        gives it back. ``kind`` labels the counters (the request's schema name, "tools" or
        "text")."""
        cfg = self._config
        if self._in_flight >= 1 + cfg.max_waiting:
            self._refused[kind] += 1
            return _overloaded(cfg.model_id, f"{cfg.max_waiting} requests wait for it already")
        self._in_flight += 1
        started = time.monotonic()
        try:
            # wait_for returns the lock when it was taken just as the time ran out
            await asyncio.wait_for(self._model_free.acquire(priority), cfg.queue_timeout_s)
        except TimeoutError:
            self._in_flight -= 1
            self._refused[kind] += 1
            return _overloaded(cfg.model_id, f"waited {cfg.queue_timeout_s:g} s for it")
        except BaseException:  # the caller went away while waiting
            self._in_flight -= 1
            raise
        self._longest_wait_s = max(self._longest_wait_s, time.monotonic() - started)
        return None

    def _leave(self, kind: str) -> None:
        self._in_flight -= 1
        self._served[kind] += 1
        self._model_free.release()

    async def chat(
        self, req: ChatCompletionRequest, traceparent: str | None = None
    ) -> dict[str, Any] | Failure:
        model = self._config.model_id
        with server_span(
            f"chat {model}",
            traceparent,
            {
                GEN_AI_OPERATION_NAME: "chat",
                GEN_AI_REQUEST_MODEL: model,
                "cortex.deployment": LLM_NAME,
            },
        ) as span:
            result = await self._chat(req)
            if isinstance(result, Failure):
                span.set_status(Status(StatusCode.ERROR, result.message[:200]))
                span.set_attribute("error.type", result.type)
            else:
                span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, result["usage"]["prompt_tokens"])
                span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, result["usage"]["completion_tokens"])
            return result

    async def _chat(self, req: ChatCompletionRequest) -> dict[str, Any] | Failure:
        prepared = to_core_request(req, self._config.default_max_tokens)
        if isinstance(prepared, Failure):
            return prepared
        try:
            response = await self._complete(prepared)
        except ModelError as exc:
            return _failure_of(exc)
        if isinstance(response, Failure):
            return response
        usage = response.usage
        return {
            "id": completion_id("chatcmpl"),
            "object": "chat.completion",
            "created": now(),
            "model": self._config.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": _message(response),
                    "finish_reason": _finish(response.finish_reason, bool(response.tool_calls)),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        }

    async def _complete(self, prepared: PreparedChat) -> ChatResponse | Failure:
        kind = _kind(prepared.request)
        if (refused := await self._admit(kind, prepared.request.priority)) is not None:
            return refused
        work = asyncio.ensure_future(self._client.chat(prepared.request))
        work.add_done_callback(lambda _: self._leave(kind))
        # Shielded: a cancelled caller cannot stop the thread, so the model stays taken
        # until the generation ends, and the next request waits for that.
        response = await asyncio.shield(work)
        return _as_tool_call(response) if prepared.forced_tool else response

    async def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[Chunk | Failure]:
        prepared = to_core_request(req, self._config.default_max_tokens)
        if isinstance(prepared, Failure):
            yield prepared
            return
        core = prepared.request
        ident, created = completion_id("chatcmpl"), now()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> Chunk:
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self._config.model_id,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        if core.tools or prepared.forced_tool:
            # A tool choice is decoded from the whole output: answer in one piece.
            try:
                response = await self._complete(prepared)
            except ModelError as exc:
                yield _failure_of(exc)
                return
            if isinstance(response, Failure):
                yield response
                return
            yield chunk({"role": "assistant", "content": ""})
            message = _message(response)
            if response.tool_calls:
                calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
                yield chunk({"tool_calls": calls})
            else:
                yield chunk({"content": response.content or ""})
            yield chunk({}, _finish(response.finish_reason, bool(response.tool_calls)))
            if include_usage:
                u = response.usage
                yield self._usage_chunk(chunk, u.prompt_tokens, u.completion_tokens)
            return

        pieces = 0
        started = False
        async for piece, finish in self._pieces(core):
            if isinstance(piece, Failure):
                yield piece
                return
            if isinstance(piece, ModelError):
                yield _failure_of(piece)
                return
            if not started:
                yield chunk({"role": "assistant", "content": ""})
                started = True
            if piece:
                pieces += 1
                yield chunk({"content": piece})
            if finish is not None:
                yield chunk({}, _finish(finish))
        if include_usage:
            # llama.cpp reports no usage while streaming: one piece is one token, and the
            # prompt is counted without the chat template's own tokens.
            prompt = sum(self._client.count_tokens(m.content or "") for m in core.messages)
            yield self._usage_chunk(chunk, prompt, pieces)

    @staticmethod
    def _usage_chunk(chunk: Any, prompt: int, completion: int) -> Chunk:
        out: Chunk = chunk({})
        out["choices"] = []
        out["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return out

    async def _pieces(
        self, core: ChatRequest
    ) -> AsyncIterator[tuple[str | ModelError | Failure, str | None]]:
        """``LlamaCppClient.stream_sync`` run in one worker thread once the model is free,
        handed over piece by piece; closing this generator stops the generation at the next
        token. A refusal (over capacity) is the one item."""
        kind = _kind(core)
        if (refused := await self._admit(kind, core.priority)) is not None:
            yield refused, None
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str | ModelError, str | None] | None] = asyncio.Queue()
        stop = threading.Event()

        def produce() -> None:
            stream: Iterator[tuple[str, str | None]] = self._client.stream_sync(core)
            try:
                for item in stream:
                    loop.call_soon_threadsafe(queue.put_nowait, item)
                    if stop.is_set():
                        break
            except ModelError as exc:
                loop.call_soon_threadsafe(queue.put_nowait, (exc, None))
            finally:
                with contextlib.suppress(Exception):
                    stream.close()  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(queue.put_nowait, None)

        worker = asyncio.ensure_future(asyncio.to_thread(produce))
        worker.add_done_callback(lambda _: self._leave(kind))
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            stop.set()
            await asyncio.shield(worker)


LlamaCppDeployment: Deployment = ray_serve.deployment(name=LLM_NAME)(LlamaCppServer)
"""``LlamaCppDeployment.bind(LlmConfig(...))``; options from ``config.deployment``."""


def build_vllm_deployment(config: LlmConfig) -> Application:
    """Ray Serve LLM's ``LLMServer`` (vLLM) built from ``config.vllm``, named ``LLM``.

    Raises:
        ImportError: vLLM (``pip install 'ray[llm]'``) is not installed.
    """
    from ray.serve.llm import LLMConfig, build_llm_deployment

    llm_config = LLMConfig.model_validate(config.vllm or {})
    return build_llm_deployment(llm_config, override_serve_options={"name": LLM_NAME})


# --- reaching either backend through a handle ----------------------------------------------


class ChatBackend(Protocol):
    """The chat model behind a Serve handle, in the OpenAI chat-completions format."""

    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any] | Failure: ...

    def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[Chunk | Failure]: ...


class _LlamaCppBackend:
    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle

    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any] | Failure:
        result: dict[str, Any] | Failure = await self._handle.chat.remote(
            req, traceparent=outgoing_traceparent()
        )
        return result

    async def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[Chunk | Failure]:
        gen: Any = self._handle.options(stream=True).chat_stream.remote(req)
        try:
            async for item in gen:
                yield item
        finally:
            gen.cancel()


class _VllmBackend:
    """Ray Serve LLM's ``LLMServer.chat``: a ``ChatCompletionResponse`` (non-streaming) or
    lists of ``data: {json}`` strings (streaming); ``ErrorResponse`` on refusal."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle

    def _request(self, req: ChatCompletionRequest) -> Any:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest as VllmRequest

        return VllmRequest.model_validate(req.model_dump(exclude_none=True, by_alias=True))

    @staticmethod
    def _failure(item: Any) -> Failure | None:
        error = getattr(item, "error", None)
        if error is None or not hasattr(error, "message"):
            return None
        status = int(getattr(error, "code", 500) or 500)
        return Failure(status, str(error.message), type=str(getattr(error, "type", "error")))

    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any] | Failure:
        gen: Any = self._handle.options(stream=True).chat.remote(self._request(req), None)
        async for item in gen:
            first = item[0] if isinstance(item, list) else item
            if (failure := self._failure(first)) is not None:
                return failure
            dumped: dict[str, Any] = first.model_dump(exclude_none=True)
            return dumped
        return Failure(502, "the model returned nothing", type="server_error")

    async def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[Chunk | Failure]:
        gen: Any = self._handle.options(stream=True).chat.remote(self._request(req), None)
        try:
            async for item in gen:
                for piece in item if isinstance(item, list) else [item]:
                    if (failure := self._failure(piece)) is not None:
                        yield failure
                        return
                    text = piece if isinstance(piece, str) else f"data: {piece.model_dump_json()}"
                    for line in text.splitlines():
                        data = line.removeprefix("data: ").strip()
                        if line.startswith("data: ") and data != "[DONE]":
                            yield json.loads(data)
        finally:
            gen.cancel()


def chat_backend(kind: Literal["llama_cpp", "vllm"], handle: DeploymentHandle[Any]) -> ChatBackend:
    """The ``ChatBackend`` of the LLM deployment behind ``handle``."""
    return _VllmBackend(handle) if kind == "vllm" else _LlamaCppBackend(handle)
