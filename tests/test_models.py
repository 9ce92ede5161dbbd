"""Model clients: structured output, the OpenAI-compatible client (over an httpx transport),
and the in-process llama.cpp backend with the packaged SmolLM2."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest

from cortex_ray import ModelError, StructuredOutputError
from cortex_ray.models import ChatMessage, ChatRequest, ScriptedModelClient, structured_call
from cortex_ray.models.llama_cpp import GRAMMAR_STRING_CAP, grammar_safe, tool_choice_schema
from cortex_ray.models.openai_compatible import OpenAICompatibleClient

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["n"],
}


def validate_n(raw: Any) -> int:
    if not isinstance(raw, dict) or not isinstance(raw.get("n"), int) or not 1 <= raw["n"] <= 10:
        raise ValueError("n must be an integer from 1 to 10")
    return int(raw["n"])


async def test_structured_call_retries_with_the_error_then_succeeds() -> None:
    model = ScriptedModelClient(["oops", '{"n": 99}', '```json\n{"n": 4}\n```'])
    messages = [ChatMessage(role="user", content="pick")]
    n = await structured_call(
        model, messages, schema=SCHEMA, validate=validate_n, schema_name="n", retries=2
    )
    assert n == 4
    assert model.requests[0].response_schema == SCHEMA
    assert "n must be an integer" in (model.requests[2].messages[-1].content or "")


async def test_structured_call_gives_up_after_its_budget() -> None:
    model = ScriptedModelClient(["a", "b"])
    with pytest.raises(StructuredOutputError) as info:
        await structured_call(
            model,
            [ChatMessage(role="user", content="x")],
            schema=SCHEMA,
            validate=validate_n,
            schema_name="n",
            retries=1,
        )
    assert info.value.attempts == 2 and info.value.last_output == "b"


def test_grammar_safe_caps_strings_and_drops_oversized_array_bounds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 2000, "minLength": 1},
            "b": {"type": "string", "maxLength": 20},
            "c": {"type": "array", "items": {"type": "string"}, "maxItems": 500},
            "d": {"type": "string", "enum": ["x", "y"]},
        },
    }
    safe = grammar_safe(schema)
    assert safe["properties"]["a"] == {
        "type": "string",
        "minLength": 1,
        "maxLength": GRAMMAR_STRING_CAP,
    }
    assert safe["properties"]["b"] == {"type": "string", "maxLength": 20}
    assert safe["properties"]["c"] == {
        "type": "array",
        "items": {"type": "string", "maxLength": GRAMMAR_STRING_CAP},
    }
    assert safe["properties"]["d"] == {"type": "string", "enum": ["x", "y"]}
    assert schema["properties"]["a"]["maxLength"] == 2000  # the original is untouched


# OpenAI-compatible client, through an httpx transport (no server, no network) -------------


def openai_transport(
    seen: list[dict[str, Any]], reply: dict[str, Any], status: int = 200
) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, "body": json.loads(request.content)})
        return httpx.Response(status, json=reply)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


async def test_openai_client_sends_schema_and_tools_and_parses_tool_calls() -> None:
    seen: list[dict[str, Any]] = []
    reply = completion(
        {
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "current_time", "arguments": "{}"},
                }
            ],
        },
        "tool_calls",
    )
    client = OpenAICompatibleClient(
        "http://127.0.0.1/v1", "m", http_client=openai_transport(seen, reply)
    )
    tools = (
        {
            "type": "function",
            "function": {"name": "current_time", "parameters": {"type": "object"}},
        },
    )
    response = await client.chat(
        ChatRequest(
            messages=(ChatMessage(role="user", content="time?"),),
            tools=tools,
            response_schema=SCHEMA,
            schema_name="n",
        )
    )
    assert seen[0]["path"] == "/v1/chat/completions"
    body = seen[0]["body"]
    assert body["model"] == "m" and body["tools"] == list(tools)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": SCHEMA},
    }
    assert response.tool_calls[0].name == "current_time"
    assert response.usage.prompt_tokens == 7
    await client.aclose()


async def test_openai_client_turns_http_errors_into_model_errors() -> None:
    seen: list[dict[str, Any]] = []
    error = {"error": {"message": "model not found", "type": "invalid_request_error"}}
    client = OpenAICompatibleClient(
        "http://127.0.0.1/v1", "m", http_client=openai_transport(seen, error, 404)
    )
    with pytest.raises(ModelError, match="model not found"):
        await client.chat(ChatRequest(messages=(ChatMessage(role="user", content="hi"),)))
    await client.aclose()


# llama.cpp with the packaged SmolLM2 -------------------------------------------------------


@pytest.mark.integration
async def test_local_model_follows_a_schema_with_large_bounds(smollm2: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "minLength": 1, "maxLength": 2000}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = await smollm2.chat(
        ChatRequest(
            messages=(
                ChatMessage(role="user", content="What is the capital of France? Answer in JSON."),
            ),
            response_schema=schema,
            max_tokens=48,
        )
    )
    parsed = json.loads(response.content)
    assert set(parsed) == {"answer"} and parsed["answer"]


@pytest.mark.integration
async def test_local_model_picks_a_tool_or_replies_in_openai_shape(smollm2: Any) -> None:
    tools = (
        {
            "type": "function",
            "function": {
                "name": "current_time",
                "description": "Read the clock.",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            },
        },
    )
    response = await smollm2.chat(
        ChatRequest(
            messages=(ChatMessage(role="user", content="What time is it right now? Use a tool."),),
            tools=tools,
            max_tokens=64,
        )
    )
    if response.tool_calls:
        assert response.tool_calls[0].name == "current_time"
        assert json.loads(response.tool_calls[0].arguments) == {}
    else:
        assert response.content  # a reply, already unwrapped from {"reply": ...}
        assert not response.content.lstrip().startswith('{"reply"')
    assert tool_choice_schema(tools)["anyOf"][1]["properties"]["tool"] == {"const": "current_time"}


# embedders -------------------------------------------------------------------------------


@pytest.mark.integration
async def test_packaged_minilm_embeds_unit_vectors_on_cpu(minilm: Any) -> None:
    vectors = await minilm.embed(["a cat sat on the mat", "a kitten rested on a rug", "tax law"])
    assert vectors.shape == (3, 384)
    assert all(abs(float((v * v).sum()) - 1.0) < 1e-4 for v in vectors)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(
    not _cuda_available(),
    reason="no CUDA device (the GPU path is checked by bench/gpu_embedding.py)",
)
async def test_embedder_runs_on_cuda_when_there_is_one(minilm: Any) -> None:
    from cortex_ray.models import SentenceTransformerEmbedder

    gpu = SentenceTransformerEmbedder(device="cuda")
    assert gpu.device.startswith("cuda")
    texts = ["the same sentence on two devices"]
    assert float((await gpu.embed(texts))[0] @ (await minilm.embed(texts))[0]) > 0.999
