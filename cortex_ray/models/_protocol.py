"""The model-client seam: the OpenAI chat-completions protocol, typed.

Every backend (an OpenAI-compatible server such as vLLM, Ray Serve LLM or llama.cpp's
server; the in-process llama.cpp backend; the scripted test double) implements
``ModelClient``, so drivers never know which one they talk to.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessage", "ChatRequest", "ChatResponse", "ModelClient", "ToolCall", "Usage"]


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = Field(description="JSON text, exactly as the model produced it")


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


BACKGROUND_PRIORITY = 10
"""``ChatRequest.priority`` of work nobody waits for (it yields to priority 0)."""


class ChatRequest(BaseModel):
    """One chat-completions call. ``tools`` are OpenAI function definitions."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...] = ()
    response_schema: dict[str, Any] | None = None
    schema_name: str = "output"
    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    """OpenAI's ``stop``: the output ends before the first of these strings (not included)."""
    priority: int = 0
    """Order in a model server's line: lower first, then arrival (vLLM's convention).
    Background work (importance rescoring) asks with ``BACKGROUND_PRIORITY`` so that what
    a run or a person waits for goes first. Sent only to cortex-ray's own deployments
    (through a handle): OpenAI's API has no such parameter, and vLLM refuses one unless it
    runs with ``--scheduling-policy priority``."""

    def to_openai(
        self,
        model: str,
        *,
        default_temperature: float,
        default_max_tokens: int,
        json_schema: bool = True,
    ) -> dict[str, Any]:
        """The OpenAI chat-completions body of this call; the schema goes as
        ``response_format`` when the server can constrain to it (``json_schema``)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [m.to_openai() for m in self.messages],
            "temperature": default_temperature if self.temperature is None else self.temperature,
            "max_tokens": self.max_tokens or default_max_tokens,
        }
        if self.tools:
            body["tools"] = list(self.tools)
        if self.stop:
            body["stop"] = list(self.stop)
        if self.response_schema is not None and json_schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": self.schema_name, "schema": self.response_schema},
            }
        return body


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatResponse(BaseModel):
    model_config = ConfigDict(frozen=True)

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = Usage()


@runtime_checkable
class ModelClient(Protocol):
    """A chat model reached through the OpenAI chat-completions protocol."""

    @property
    def name(self) -> str: ...

    @property
    def supports_json_schema(self) -> bool:
        """True when ``response_schema`` constrains decoding (not just asks nicely)."""
        ...

    async def chat(self, request: ChatRequest) -> ChatResponse: ...

    async def aclose(self) -> None: ...
