"""Reaching the chat model behind a Serve handle, whichever backend serves it: this
project's llama.cpp deployment or Ray Serve LLM (vLLM)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

from cortex_ray.observability import outgoing_traceparent
from serve.models._openai import ChatCompletionRequest, Failure

try:
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["ChatBackend", "Chunk", "chat_backend"]

Chunk = dict[str, Any]


class ChatBackend(Protocol):
    """The chat model behind a Serve handle, in the OpenAI chat-completions format.

    ``wait_s``: how long the request may wait in the replica's line for a model over
    capacity (a caller's own deadline; ``None``: the replica's ``queue_timeout_s``).
    ``load``: the replica's line as counters (``ReplicaLine.load``), ``None`` where the
    backend reports none."""

    async def chat(
        self, req: ChatCompletionRequest, wait_s: float | None = None
    ) -> dict[str, Any] | Failure: ...

    async def load(self) -> dict[str, Any] | None: ...

    def chat_stream(self, req: ChatCompletionRequest) -> AsyncIterator[Chunk | Failure]: ...


class _LlamaCppBackend:
    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle

    async def chat(
        self, req: ChatCompletionRequest, wait_s: float | None = None
    ) -> dict[str, Any] | Failure:
        result: dict[str, Any] | Failure = await self._handle.chat.remote(
            req, traceparent=outgoing_traceparent(), wait_s=wait_s
        )
        return result

    async def load(self) -> dict[str, Any] | None:
        counters: dict[str, Any] = await self._handle.load.remote()
        return counters

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

    async def chat(
        self, req: ChatCompletionRequest, wait_s: float | None = None
    ) -> dict[str, Any] | Failure:
        # vLLM queues inside its engine; Serve's max_queued_requests refuses beyond it
        gen: Any = self._handle.options(stream=True).chat.remote(self._request(req), None)
        async for item in gen:
            first = item[0] if isinstance(item, list) else item
            if (failure := self._failure(first)) is not None:
                return failure
            dumped: dict[str, Any] = first.model_dump(exclude_none=True)
            return dumped
        return Failure(502, "the model returned nothing", type="server_error")

    async def load(self) -> dict[str, Any] | None:
        return None

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
