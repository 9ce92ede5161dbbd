"""A scripted model client: the test double behind the real ``ModelClient`` interface.

It answers from a script (strings, ``ChatResponse`` objects, or callables of the request,
sync or async) and records the latest requests, so deterministic cycle tests and benchmarks
can drive the real drivers without a model.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from cortex_ray._exceptions import ModelError
from cortex_ray.models._protocol import ChatRequest, ChatResponse

__all__ = ["ScriptedModelClient"]

Answer = str | ChatResponse
Responder = Callable[[ChatRequest], Answer | Awaitable[Answer]]
Reply = Answer | Responder


class ScriptedModelClient:
    """Replies from a script, in order; ``responder`` answers once the script runs out.

    ``requests`` keeps the last ``keep_requests`` requests (oldest first), so a long-lived
    client (a benchmark, a session actor) does not grow without bound."""

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        responder: Responder | None = None,
        supports_json_schema: bool = True,
        name: str = "scripted",
        keep_requests: int = 1000,
    ) -> None:
        self._script: deque[Reply] = deque(script)
        self._responder = responder
        self._supports_json_schema = supports_json_schema
        self._name = name
        self.requests: deque[ChatRequest] = deque(maxlen=keep_requests)

    @property
    def name(self) -> str:
        return self._name

    @property
    def supports_json_schema(self) -> bool:
        return self._supports_json_schema

    def push(self, *replies: Reply) -> None:
        self._script.extend(replies)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if self._script:
            reply: Any = self._script.popleft()
        elif self._responder is not None:
            reply = self._responder
        else:
            raise ModelError("scripted model: the script ran out")
        if callable(reply):
            reply = reply(request)
            if inspect.isawaitable(reply):
                reply = await reply
        if isinstance(reply, ChatResponse):
            return reply
        return ChatResponse(content=str(reply), finish_reason="stop")

    async def aclose(self) -> None:
        return None
