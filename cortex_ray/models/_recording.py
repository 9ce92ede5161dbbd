"""Recording what a decision asked its model, for replay (a run's cassette, issue 14 point 6).

``RecordingModelClient`` wraps the drivers' model. While a ``recording()`` block is open in
the current task (the cycle opens one around each autonomous step's DECIDE), every call is
appended to the block's tape as a ``ModelExchange``: a digest of the request and the
response as it came back. Outside a block it only forwards: interactive turns, importance
scoring and tools are not recorded.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from cortex_ray._types import ModelExchange, RecordedToolCall
from cortex_ray.models._protocol import ChatRequest, ChatResponse, ModelClient, Usage
from cortex_ray.observability import (
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    SpanKind,
    bound_messages,
    captured,
    diagnostics,
    metrics,
    tracer,
)
from cortex_ray.settings import TracingOptions

__all__ = ["RecordingModelClient", "exchange", "recording", "request_digest"]

_TAPE: ContextVar[list[ModelExchange] | None] = ContextVar("cortex_model_tape", default=None)


def request_digest(request: ChatRequest) -> str:
    """sha256 of the request as canonical JSON, without its priority (a server's line
    order, not what the model is asked)."""
    body = request.model_dump(mode="json", exclude={"priority"})
    raw = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def exchange(
    request: ChatRequest,
    response: ChatResponse,
    latency_ms: float,
    *,
    model: str = "",
    constrained: bool = True,
) -> ModelExchange:
    """The record of one call."""
    return ModelExchange(
        model=model,
        constrained=constrained,
        schema_name=request.schema_name if request.response_schema is not None else "text",
        request_sha256=request_digest(request),
        prompt_chars=sum(len(m.content or "") for m in request.messages),
        content=response.content,
        tool_calls=tuple(
            RecordedToolCall(id=c.id, name=c.name, arguments=c.arguments)
            for c in response.tool_calls
        ),
        finish_reason=response.finish_reason,
        prompt_tokens=response.usage.prompt_tokens,
        completion_tokens=response.usage.completion_tokens,
        latency_ms=round(latency_ms, 3),
    )


@contextmanager
def recording() -> Iterator[list[ModelExchange]]:
    """Record the model calls made through a ``RecordingModelClient`` in this task (and the
    tasks it starts) until the block ends; yields the tape."""
    tape: list[ModelExchange] = []
    token = _TAPE.set(tape)
    try:
        yield tape
    finally:
        _TAPE.reset(token)


class RecordingModelClient:
    """A ``ModelClient`` that appends each call to the open ``recording()`` tape, if any,
    and opens a ``chat {model}`` span for it (GenAI conventions: model, token usage, finish
    reason; the messages themselves only with ``capture``, scrubbed and bounded)."""

    def __init__(self, inner: ModelClient, *, capture: TracingOptions | None = None) -> None:
        self.inner = inner
        self._capture = capture if capture is not None and capture.capture_content else None

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def supports_json_schema(self) -> bool:
        return self.inner.supports_json_schema

    async def chat(self, request: ChatRequest) -> ChatResponse:
        tape = _TAPE.get()
        started = time.perf_counter()
        with tracer.start_as_current_span(
            f"chat {self.inner.name}",
            attributes={
                GEN_AI_OPERATION_NAME: "chat",
                GEN_AI_REQUEST_MODEL: self.inner.name,
                "cortex.schema": request.schema_name if request.response_schema else "text",
                "cortex.tools_offered": len(request.tools),
            },
            kind=SpanKind.CLIENT,
        ) as span:
            if self._capture is not None and span.is_recording():
                limit = self._capture.max_content_chars
                messages = bound_messages([m.to_openai() for m in request.messages], limit)
                span.set_attribute(GEN_AI_INPUT_MESSAGES, json.dumps(messages))
            schema = request.schema_name if request.response_schema else "text"
            try:
                with diagnostics.StallWatch(self.inner.name):
                    response = await self.inner.chat(request)
            except BaseException as exc:
                model_call_done("chat", self.inner.name, started, "error")
                diagnostics.model_call(
                    self.inner.name,
                    schema=schema,
                    seconds=time.perf_counter() - started,
                    error=f"{type(exc).__name__}: {exc}",
                )
                raise
            model_call_done("chat", self.inner.name, started, "ok", response.usage)
            diagnostics.model_call(
                self.inner.name,
                schema=schema,
                seconds=time.perf_counter() - started,
                tokens_in=response.usage.prompt_tokens,
                tokens_out=response.usage.completion_tokens,
                finish_reason=response.finish_reason,
            )
            span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, response.usage.prompt_tokens)
            span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, response.usage.completion_tokens)
            if response.finish_reason:
                span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, [response.finish_reason])
            if self._capture is not None and span.is_recording():
                out = response.content or json.dumps([c.model_dump() for c in response.tool_calls])
                span.set_attribute(
                    GEN_AI_OUTPUT_MESSAGES, captured(out, self._capture.max_content_chars)
                )
        if tape is None:
            return response
        took = (time.perf_counter() - started) * 1000
        tape.append(
            exchange(
                request,
                response,
                took,
                model=self.inner.name,
                constrained=self.inner.supports_json_schema,
            )
        )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def model_call_done(
    operation: str, model: str, started: float, outcome: str, usage: Usage | None = None
) -> None:
    """Record a model call's duration and, for chat, its input and output tokens."""
    metrics.record(
        metrics.MODEL_DURATION,
        time.perf_counter() - started,
        gen_ai_operation_name=operation,
        gen_ai_request_model=model,
        outcome=outcome,
    )
    if usage is None:
        return
    for kind, tokens in (("input", usage.prompt_tokens), ("output", usage.completion_tokens)):
        metrics.record(
            metrics.MODEL_TOKENS,
            tokens,
            gen_ai_operation_name=operation,
            gen_ai_request_model=model,
            gen_ai_token_type=kind,
        )
