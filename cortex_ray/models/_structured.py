"""Structured output: a JSON-schema-constrained call, validated, retried a bounded number
of times."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from cortex_ray._exceptions import ModelError, StructuredOutputError
from cortex_ray.models._protocol import ChatMessage, ChatRequest, ModelClient

__all__ = ["structured_call"]

T = TypeVar("T")
log = logging.getLogger("cortex_ray.models")


def _parse(text: str | None) -> Any:
    if not text:
        raise ValueError("the model returned no content")
    text = text.strip()
    if text.startswith("```"):  # unconstrained backends like fencing their JSON
        text = text.strip("`")
        text = text.removeprefix("json").strip()
    # strict=False reads raw control characters inside strings: what a grammar or an
    # unconstrained backend let through is still the JSON the model meant (a newline
    # in a message), and the schema is validated afterwards anyway.
    return json.loads(text, strict=False)


async def structured_call(
    client: ModelClient,
    messages: list[ChatMessage],
    *,
    schema: dict[str, Any],
    validate: Callable[[Any], T],
    schema_name: str,
    retries: int,
    max_tokens: int | None = None,
    temperature: float | None = None,
    priority: int = 0,
) -> T:
    """Ask for JSON matching ``schema`` and return ``validate(parsed)``.

    Where the backend constrains decoding to the schema, the schema is only passed as the
    response format; otherwise it is also written into the prompt. Output that does not
    parse or validate is shown back to the model with the error, up to ``retries`` times.

    Raises:
        StructuredOutputError: still invalid after ``retries + 1`` attempts.
    """
    convo = list(messages)
    if not client.supports_json_schema:
        convo.append(
            ChatMessage(
                role="system",
                content="Answer with one JSON object matching this JSON schema, and nothing "
                "else:\n" + json.dumps(schema, separators=(",", ":")),
            )
        )
    last: str | None = None
    error = ""
    for attempt in range(retries + 1):
        request = ChatRequest(
            messages=tuple(convo),
            response_schema=schema,
            schema_name=schema_name,
            max_tokens=max_tokens,
            temperature=temperature,
            priority=priority,
        )
        response = await client.chat(request)
        last = response.content
        try:
            if response.finish_reason == "length":
                raise ValueError("the output was cut off at the token limit; answer shorter")
            return validate(_parse(last))
        except (ValueError, ValidationError, TypeError, KeyError) as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.info(
                "structured output %s invalid (attempt %d/%d): %s",
                schema_name,
                attempt + 1,
                retries + 1,
                error,
            )
            convo.append(ChatMessage(role="assistant", content=last or ""))
            convo.append(
                ChatMessage(
                    role="user",
                    content=f"That output was invalid ({error}). Answer again with only the "
                    "JSON object the schema asks for.",
                )
            )
        except ModelError:
            raise
    raise StructuredOutputError(
        f"{schema_name}: no valid output after {retries + 1} attempts ({error})",
        attempts=retries + 1,
        last_output=last,
    )
