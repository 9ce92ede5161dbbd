"""The llama.cpp replica's line for its model: what a run or a person waits for goes before
background work (importance rescoring), then arrival order; a waiter that leaves is
skipped, and one handed the model as it left hands it on."""

from __future__ import annotations

import asyncio
from typing import Any, cast
from uuid import uuid4

import pytest

from cortex_ray import MemoryKind, ModelError
from cortex_ray.memory._importance import (
    HeuristicImportanceScorer,
    ImportanceRescorer,
    ModelImportanceScorer,
)
from cortex_ray.models import (
    BACKGROUND_PRIORITY,
    TEST_MODEL_NAME,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    Usage,
)
from serve.models import LlmConfig
from serve.models._handles import HandleModelClient
from serve.models._llm import LlamaCppServer, ModelLine
from serve.models._openai import ChatCompletionRequest, Failure


async def _take(line: ModelLine, priority: int, name: str, order: list[str]) -> None:
    await line.acquire(priority)
    order.append(name)
    await asyncio.sleep(0)
    line.release()


async def test_lower_priority_numbers_go_first_then_arrival() -> None:
    line = ModelLine()
    await line.acquire()  # the model is busy
    order: list[str] = []
    waiters = []
    for name, priority in (("bg1", 10), ("bg2", 10), ("fg1", 0), ("fg2", 0)):
        waiters.append(asyncio.create_task(_take(line, priority, name, order)))
        await asyncio.sleep(0)  # arrive in this order
    line.release()
    await asyncio.gather(*waiters)
    assert order == ["fg1", "fg2", "bg1", "bg2"]
    assert not line.locked()


async def test_a_waiter_that_left_is_skipped() -> None:
    line = ModelLine()
    await line.acquire()
    order: list[str] = []
    gone = asyncio.create_task(_take(line, 0, "gone", order))
    stays = asyncio.create_task(_take(line, 5, "stays", order))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    line.release()
    await stays
    assert order == ["stays"]
    assert not line.locked()


async def test_a_waiter_handed_the_model_as_it_left_hands_it_on() -> None:
    line = ModelLine()
    await line.acquire()
    order: list[str] = []
    leaving = asyncio.create_task(_take(line, 0, "leaving", order))
    await asyncio.sleep(0)
    nxt = asyncio.create_task(_take(line, 1, "next", order))
    await asyncio.sleep(0)
    line.release()  # hands the model to "leaving"…
    leaving.cancel()  # …which is cancelled before it could run
    await asyncio.gather(leaving, return_exceptions=True)
    await asyncio.wait_for(nxt, 5)
    assert order == ["next"]
    assert not line.locked()


class _Recording:
    """A model client that records each request and answers an importance of 7."""

    name = "recording"
    supports_json_schema = True

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return ChatResponse(content='{"importance": 7}', usage=Usage(), finish_reason="stop")


async def test_background_rescoring_asks_with_the_background_priority() -> None:
    model = _Recording()
    scorer = ModelImportanceScorer(
        model, retries=0, fallback=HeuristicImportanceScorer(), deferred=True
    )
    applied: list[float] = []

    async def apply(org_id: str, memory_id: Any, importance: float) -> bool:
        applied.append(importance)
        return True

    rescorer = ImportanceRescorer(scorer, apply, concurrency=1, queue_size=4)
    assert rescorer.submit("org", uuid4(), MemoryKind.SEMANTIC, "the office opens at 9")
    await rescorer.drain()
    await rescorer.aclose()
    assert applied == [7.0]
    assert [r.priority for r in model.requests] == [BACKGROUND_PRIORITY]
    # A scoring someone waits for (inline) keeps priority 0.
    await scorer.rate(MemoryKind.SEMANTIC, "x")
    assert model.requests[-1].priority == 0


def _body(content: str, priority: int) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            "temperature": 0.0,
            "priority": priority,
        }
    )


@pytest.mark.timeout(120)
async def test_the_real_replica_serves_a_foreground_call_before_queued_background_ones() -> None:
    """The packaged SmolLM2 through the replica class: with the model busy, two background
    calls then one foreground call arrive; the foreground one is answered first."""
    server = LlamaCppServer(LlmConfig(model_id=TEST_MODEL_NAME))
    done: list[str] = []

    async def call(name: str, priority: int) -> None:
        result = await server.chat(_body(f"Say {name}.", priority))
        assert isinstance(result, dict), result
        done.append(name)

    await server._line.model.acquire()  # a generation in progress
    calls = []
    for name, priority in (("bg1", BACKGROUND_PRIORITY), ("bg2", BACKGROUND_PRIORITY), ("fg", 0)):
        calls.append(asyncio.create_task(call(name, priority)))
        await asyncio.sleep(0.05)
    assert (await server.load())["in_flight"] == 3  # all three wait: the model is taken
    server._line.model.release()
    await asyncio.gather(*calls)
    assert done[0] == "fg"
    assert sorted(done) == ["bg1", "bg2", "fg"]


class _Overloaded:
    """A chat backend whose line is full ``times`` times, then answers."""

    def __init__(self, times: int, code: str = "model_overloaded") -> None:
        self.times = times
        self.code = code
        self.calls = 0

    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any] | Failure:
        self.calls += 1
        if self.calls <= self.times:
            return Failure(503, "over capacity", type="server_error", code=self.code)
        return {
            "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }


def _client(backend: _Overloaded) -> HandleModelClient:
    client = HandleModelClient(cast(Any, None), "m", overload_backoff_s=0.01)
    client._backend = cast(Any, backend)
    return client


def _ask(priority: int = 0) -> ChatRequest:
    return ChatRequest(messages=(ChatMessage(role="user", content="hi"),), priority=priority)


async def test_a_full_line_is_tried_again_through_a_handle() -> None:
    backend = _Overloaded(times=2)
    response = await _client(backend).chat(_ask())
    assert response.content == "ok"
    assert backend.calls == 3


async def test_retries_end_and_other_failures_are_not_retried() -> None:
    full = _Overloaded(times=10)
    with pytest.raises(ModelError, match="over capacity"):
        await _client(full).chat(_ask())
    assert full.calls == 4  # the call and 3 retries
    other = _Overloaded(times=1, code="invalid_value")
    with pytest.raises(ModelError):
        await _client(other).chat(_ask())
    assert other.calls == 1


async def test_background_work_is_not_retried() -> None:
    backend = _Overloaded(times=1)
    with pytest.raises(ModelError):
        await _client(backend).chat(_ask(priority=BACKGROUND_PRIORITY))
    assert backend.calls == 1
