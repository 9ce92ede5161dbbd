"""The OpenAI-compatible wire format: request bodies (validated strictly), a few response
pieces, and OpenAI's error body.

Every refusal is ``{"error": {"message", "type", "param", "code", "correlationId"}}``: OpenAI's
body plus the request's correlation id (also the ``X-Correlation-Id`` header), rendered by
``serve._error_body`` as the API's is (bounded, valid UTF-8, user input quoted truncated):

status  type                    code                        when
400     invalid_request_error   invalid_value / invalid_type a field is missing, has the
                                                            wrong type or an invalid value
                                                            (``param`` names it)
400     invalid_request_error   empty_input                 empty input, query or messages
400     invalid_request_error   too_many_inputs             more inputs/documents than allowed
400     invalid_request_error   input_too_long              a text over ``max_input_chars``
400     invalid_request_error   context_length_exceeded     the prompt does not fit the model
400     invalid_request_error   unsupported_parameter       a parameter this backend ignores
                                                            would change the answer
422     invalid_request_error   invalid_text                a string (anywhere, keys of free-form
                                                            objects too) holds a NUL or a lone
                                                            surrogate: text no model can read
404     invalid_request_error   model_not_found             unknown ``model``
404     invalid_request_error   not_found                   unknown route
503     server_error            model_unavailable           the model is not deployed or
                                                            could not load (the reranker here)
500     server_error            internal_error              anything else (logged)
502     server_error            backend_error               the model backend failed
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator
from pydantic import StrictStr as _StrictStr
from pydantic_core import PydanticCustomError

from cortex_ray import json_problem, text_problem
from serve._error_body import openai_body, openai_error_response, quote

__all__ = [
    "ChatCompletionRequest",
    "ChatMessageIn",
    "EmbeddingsRequest",
    "Failure",
    "FailureError",
    "RerankRequest",
    "ResponseFormat",
    "ToolDefinition",
    "completion_id",
    "now",
]


@dataclass(frozen=True)
class Failure:
    """An OpenAI-style refusal. Deployments return (or yield) one instead of raising, so it
    crosses Serve handles as plain data."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        """The error body (with the request's correlation id), bounded and valid UTF-8."""
        return openai_body(
            self.message, status=self.status, type=self.type, param=self.param, code=self.code
        )

    def response(self) -> JSONResponse:
        return openai_error_response(
            self.status, self.message, type=self.type, param=self.param, code=self.code
        )

    @staticmethod
    def unknown_model(model: str, known: list[str]) -> Failure:
        return Failure(
            404,
            f"The model {quote(model)} does not exist. Models served here: {', '.join(known)}",
            param="model",
            code="model_not_found",
        )

    @staticmethod
    def unavailable(what: str, reason: str) -> Failure:
        return Failure(
            503, f"{what} is unavailable: {reason}", type="server_error", code="model_unavailable"
        )


class FailureError(Exception):
    """Raised inside the ingress; its exception handler answers ``failure.response()``."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def _text(value: str) -> str:
    if (reason := text_problem(value)) is not None:
        raise PydanticCustomError("invalid_text", reason)
    return value


def _json(value: dict[str, Any]) -> dict[str, Any]:
    if (reason := json_problem(value)) is not None:
        raise PydanticCustomError("invalid_text", reason)
    return value


StrictStr = Annotated[_StrictStr, AfterValidator(_text)]
"""A string of text that can be read: no NUL, no lone surrogate (the core's
``text_problem``; refused with 422, as on the API)."""

JsonDict = Annotated[dict[str, Any], AfterValidator(_json)]
"""A free-form JSON object whose every key and string is such text."""


class _Body(BaseModel):
    # No silent coercion ("3" is not 3) and no silently ignored fields.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- /v1/embeddings ------------------------------------------------------------------------


class EmbeddingsRequest(_Body):
    model: StrictStr
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: StrictStr | None = None


# --- /v1/rerank (the Cohere/Jina shape vLLM serves) ----------------------------------------


class _RerankDocument(_Body):
    text: StrictStr


class RerankRequest(_Body):
    model: StrictStr
    query: StrictStr
    documents: list[StrictStr | _RerankDocument]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


# --- /v1/chat/completions ------------------------------------------------------------------


class _TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class _FunctionCall(_Body):
    name: StrictStr
    arguments: StrictStr


class _ToolCallIn(_Body):
    id: StrictStr
    type: Literal["function"] = "function"
    function: _FunctionCall


class ChatMessageIn(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[_TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: StrictStr | None = None
    refusal: StrictStr | None = None

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _FunctionDefinition(_Body):
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    parameters: JsonDict | None = None
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: _FunctionDefinition


class _JsonSchemaFormat(_Body):
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    schema_: JsonDict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaFormat | None = None


class _StreamOptions(_Body):
    include_usage: bool = False


class _NamedToolChoice(_Body):
    type: Literal["function"]
    function: dict[StrictStr, StrictStr]


class ChatCompletionRequest(_Body):
    model: StrictStr
    messages: list[ChatMessageIn]
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logprobs: bool | None = None
    user: StrictStr | None = None
    # vLLM's extension: lower is served first (then arrival); cortex-ray's llama.cpp line
    # honours it, and its background importance rescoring asks with a higher number.
    priority: int = Field(default=0, ge=-1000, le=1000)

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        # OpenAI's limits: up to 4 sequences; an empty one would stop before the first token
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("a stop sequence may not be empty")
        return value

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
