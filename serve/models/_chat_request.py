"""OpenAI chat-completions bodies → the core's ``ChatRequest`` (what the llama.cpp backend
refuses, as a ``Failure``), and the core's ``ChatResponse`` → OpenAI message parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from cortex_ray import ModelError
from cortex_ray.models import ChatMessage, ChatRequest, ChatResponse, ToolCall
from cortex_ray.models.llama_cpp import decode_tool_choice, tool_choice_schema
from serve.models._openai import ChatCompletionRequest, Failure

__all__ = [
    "PreparedChat",
    "as_tool_call",
    "failure_of",
    "finish_of",
    "message_of",
    "to_core_request",
]


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


def as_tool_call(response: ChatResponse) -> ChatResponse:
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


def failure_of(exc: ModelError) -> Failure:
    text = str(exc)
    if "exceed context window" in text:
        return Failure(400, text, param="messages", code="context_length_exceeded")
    return Failure(502, text, type="server_error", code="backend_error")


def message_of(response: ChatResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": response.content, "refusal": None}
    if response.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in response.tool_calls
        ]
    return out


def finish_of(reason: str | None, tool_calls: bool = False) -> str:
    if reason == "length":  # a call cut off too: its arguments are incomplete
        return "length"
    if tool_calls:
        return "tool_calls"
    return reason if reason in ("stop", "length") else "stop"
