"""The model-request guard: tests never reach a model server off this machine by accident.

The clients get an ``http_client`` with a ``MockTransport`` that records what reaches it, so
"refused without any network traffic" is an observed fact, not a timing guess.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest

from cortex_ray import ModelError
from cortex_ray.models import (
    ChatMessage,
    ChatRequest,
    is_local_model_url,
    model_requests_allowed,
    override_allow_model_requests,
)
from cortex_ray.models.openai_compatible import OpenAICompatibleClient
from cortex_ray.models.openai_embeddings import OpenAICompatibleEmbedder

pytestmark = pytest.mark.unit

# TEST-NET-3 (RFC 5737): never routed, so nothing may ever be sent there.
REMOTE = "http://203.0.113.1:8000/v1"

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Recorder:
    """A transport that answers like an OpenAI-compatible server and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/embeddings"):
            count = len(json.loads(request.content)["input"])
            data = [
                {"object": "embedding", "index": i, "embedding": [1.0, 0.0, 0.0]}
                for i in range(count)
            ]
            body: dict[str, Any] = {"object": "list", "data": data, "model": "e"}
            return httpx.Response(200, json=body)
        return httpx.Response(200, json=COMPLETION)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


def chat_client(base_url: str, recorder: Recorder) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(base_url, "m", http_client=recorder.client())


def embedder(base_url: str, recorder: Recorder) -> OpenAICompatibleEmbedder:
    return OpenAICompatibleEmbedder(base_url, "e", dim=3, http_client=recorder.client())


REQUEST = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.9.10/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://[::ffff:127.0.0.1]/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://LOCALHOST./v1", True),
        ("http://models.localhost/v1", True),
        (REMOTE, False),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
        ("http://[2001:db8::1]/v1", False),
        ("http://localhost.example.com/v1", False),
        ("http://[::ffff:203.0.113.1]/v1", False),
    ],
)
def test_what_counts_as_local(url: str, local: bool) -> None:
    assert is_local_model_url(url) is local


def test_the_suite_runs_with_requests_blocked() -> None:
    assert model_requests_allowed() is False


async def test_a_remote_chat_request_is_refused_before_any_traffic() -> None:
    recorder = Recorder()
    client = chat_client(REMOTE, recorder)
    with pytest.raises(ModelError, match=r"203\.0\.113\.1.*pytest\.mark\.allow_model_requests"):
        await client.chat(REQUEST)
    assert recorder.requests == []
    await client.aclose()


async def test_a_remote_embedding_request_is_refused_before_any_traffic() -> None:
    recorder = Recorder()
    client = embedder(REMOTE, recorder)
    with pytest.raises(ModelError, match="override_allow_model_requests"):
        await client.embed(["a"])
    assert recorder.requests == []
    await client.aclose()


async def test_the_default_transport_is_refused_too() -> None:
    # No mock: had the guard let it through, the error would be the SDK's connection
    # error (after retries), not the guard's message.
    client = OpenAICompatibleClient(REMOTE, "m", timeout_s=1.0)
    with pytest.raises(ModelError, match="refused: model requests to servers off this machine"):
        await client.chat(REQUEST)
    await client.aclose()


@pytest.mark.parametrize(
    "base_url", ["http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "http://localhost/v1"]
)
async def test_loopback_requests_go_through(base_url: str) -> None:
    recorder = Recorder()
    client = chat_client(base_url, recorder)
    response = await client.chat(REQUEST)
    assert response.content == "hello"
    assert [r.url.host for r in recorder.requests] == [httpx.URL(base_url).host]
    await client.aclose()

    vectors = await embedder(base_url, recorder).embed(["a", "b"])
    assert vectors.shape == (2, 3)
    assert len(recorder.requests) == 2


async def test_a_context_manager_opts_in_and_restores() -> None:
    recorder = Recorder()
    client = chat_client(REMOTE, recorder)
    with override_allow_model_requests(True):
        assert (await client.chat(REQUEST)).content == "hello"
        assert (await embedder(REMOTE, recorder).embed(["a"])).shape == (1, 3)
    assert [str(r.url) for r in recorder.requests] == [
        f"{REMOTE}/chat/completions",
        f"{REMOTE}/embeddings",
    ]
    assert model_requests_allowed() is False
    with pytest.raises(ModelError):
        await client.chat(REQUEST)
    assert len(recorder.requests) == 2
    await client.aclose()


@pytest.mark.allow_model_requests
async def test_a_marker_opts_in() -> None:
    assert model_requests_allowed() is True
    recorder = Recorder()
    client = chat_client(REMOTE, recorder)
    assert (await client.chat(REQUEST)).content == "hello"
    assert [r.url.host for r in recorder.requests] == ["203.0.113.1"]
    await client.aclose()
