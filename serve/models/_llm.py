"""The chat model: this project's llama.cpp deployment on CPU, Ray Serve LLM (vLLM) on GPU.

Both are reached through a ``ChatBackend`` (``_chat_backends``: ``chat`` and ``chat_stream``
in the OpenAI chat-completions format, as plain dicts), so the HTTP ingress and the
in-cluster ``HandleModelClient`` never know which one runs:

- ``LlamaCppServer`` wraps the core's ``LlamaCppClient`` (the packaged SmolLM2 by default):
  tools and JSON schemas become a decoding grammar (``_chat_request``); text is streamed
  token by token; a tool call is sent as one delta once decoded. Its line for the model,
  and what it reports of its capacity, is ``_line``'s ``ReplicaLine``.
- ``build_vllm_deployment`` builds Ray Serve LLM's ``LLMServer`` from ``LlmConfig.vllm``.
  ``ray.serve.llm`` is imported only there: without vLLM installed it raises ImportError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)
from opentelemetry.trace import Status, StatusCode
from pydantic import SecretStr

from cortex_ray import ModelError
from cortex_ray.models import ChatRequest, ChatResponse
from cortex_ray.observability import server_span
from serve.models._chat_backends import ChatBackend, Chunk, chat_backend
from serve.models._chat_request import (
    PreparedChat,
    as_tool_call,
    failure_of,
    finish_of,
    message_of,
    to_core_request,
)
from serve.models._config import LlmConfig
from serve.models._line import ModelLine, ReplicaLine, request_kind
from serve.models._openai import ChatCompletionRequest, Failure, completion_id, now
from serve.models._spans import replica_tracing

try:
    from ray import serve as ray_serve
    from ray.serve import Application, Deployment
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = [
    "LLM_NAME",
    "ChatBackend",
    "LlamaCppDeployment",
    "LlamaCppServer",
    "ModelLine",
    "PreparedChat",
    "build_vllm_deployment",
    "chat_backend",
    "to_core_request",
]

log = logging.getLogger("serve.models")

LLM_NAME = "LLM"


class LlamaCppServer:
    """A GGUF chat model (the packaged SmolLM2 by default) through the core's
    ``LlamaCppClient``; llama.cpp runs one generation at a time per replica.

    Requests wait for the model in order of ``priority``, then arrival (``ReplicaLine``), at most
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
        self._line = ReplicaLine(self._config)
        log.info("llm %s ready (llama.cpp, %s)", self._config.model_id, self._client.name)

    async def health(self) -> dict[str, Any]:
        return {"model_id": self._config.model_id, "available": True, "reason": None}

    async def load(self) -> dict[str, Any]:
        """This replica's line for the model, as counters (``ReplicaLine.load``)."""
        return self._line.load()

    async def chat(
        self,
        req: ChatCompletionRequest,
        traceparent: str | None = None,
        wait_s: float | None = None,
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
            result = await self._chat(req, wait_s)
            if isinstance(result, Failure):
                span.set_status(Status(StatusCode.ERROR, result.message[:200]))
                span.set_attribute("error.type", result.type)
            else:
                span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, result["usage"]["prompt_tokens"])
                span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, result["usage"]["completion_tokens"])
            return result

    async def _chat(
        self, req: ChatCompletionRequest, wait_s: float | None = None
    ) -> dict[str, Any] | Failure:
        prepared = to_core_request(req, self._config.default_max_tokens)
        if isinstance(prepared, Failure):
            return prepared
        try:
            response = await self._complete(prepared, wait_s)
        except ModelError as exc:
            return failure_of(exc)
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
                    "message": message_of(response),
                    "finish_reason": finish_of(response.finish_reason, bool(response.tool_calls)),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        }

    async def _complete(
        self, prepared: PreparedChat, wait_s: float | None = None
    ) -> ChatResponse | Failure:
        kind = request_kind(prepared.request)
        line = self._line
        if (refused := await line.admit(kind, prepared.request.priority, wait_s)) is not None:
            return refused
        work = asyncio.ensure_future(self._client.chat(prepared.request))
        work.add_done_callback(lambda _: line.leave(kind))
        # Shielded: a cancelled caller cannot stop the thread, so the model stays taken
        # until the generation ends, and the next request waits for that.
        response = await asyncio.shield(work)
        return as_tool_call(response) if prepared.forced_tool else response

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
                yield failure_of(exc)
                return
            if isinstance(response, Failure):
                yield response
                return
            yield chunk({"role": "assistant", "content": ""})
            message = message_of(response)
            if response.tool_calls:
                calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
                yield chunk({"tool_calls": calls})
            else:
                yield chunk({"content": response.content or ""})
            yield chunk({}, finish_of(response.finish_reason, bool(response.tool_calls)))
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
                yield failure_of(piece)
                return
            if not started:
                yield chunk({"role": "assistant", "content": ""})
                started = True
            if piece:
                pieces += 1
                yield chunk({"content": piece})
            if finish is not None:
                yield chunk({}, finish_of(finish))
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
        kind = request_kind(core)
        line = self._line
        if (refused := await line.admit(kind, core.priority)) is not None:
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
        worker.add_done_callback(lambda _: line.leave(kind))
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
