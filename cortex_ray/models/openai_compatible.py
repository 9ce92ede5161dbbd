"""A client for any OpenAI-compatible chat-completions server (vLLM, Ray Serve LLM,
llama.cpp's server, the cortex-ray model deployment, hosted APIs), built on the official
``openai`` SDK."""

from __future__ import annotations

import httpx2 as httpx
import openai

from cortex_ray._exceptions import ModelError
from cortex_ray.models._guard import check_model_request
from cortex_ray.models._protocol import ChatRequest, ChatResponse, ToolCall, Usage

__all__ = ["OpenAICompatibleClient"]


class OpenAICompatibleClient:
    """Talks the chat-completions protocol to ``base_url``; schemas go as ``response_format``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "not-needed",
        timeout_s: float = 120.0,
        max_retries: int = 2,
        supports_json_schema: bool = True,
        default_temperature: float = 0.0,
        default_max_tokens: int = 512,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            # the SDK retries connection errors, 408/409/429 and 5xx with exponential backoff
            max_retries=max_retries,
            http_client=http_client,
        )
        self._model = model
        self._supports_json_schema = supports_json_schema
        self._temperature = default_temperature
        self._max_tokens = default_max_tokens

    @property
    def name(self) -> str:
        return self._model

    @property
    def supports_json_schema(self) -> bool:
        return self._supports_json_schema

    async def chat(self, request: ChatRequest) -> ChatResponse:
        kwargs = request.to_openai(
            self._model,
            default_temperature=self._temperature,
            default_max_tokens=self._max_tokens,
            json_schema=self._supports_json_schema,
        )
        # Before the SDK sees the request, so a blocked one never opens a connection.
        check_model_request(str(self._client.base_url), model=self._model)
        try:
            completion = await self._client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            raise ModelError(f"{self._model}: {exc}") from exc
        if not completion.choices:
            raise ModelError(f"{self._model}: the server returned no choices")
        choice = completion.choices[0]
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
            for c in (choice.message.tool_calls or [])
            if c.type == "function"
        )
        usage = completion.usage
        return ChatResponse(
            content=choice.message.content,
            tool_calls=calls,
            finish_reason=choice.finish_reason,
            usage=Usage(
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
            ),
        )

    async def aclose(self) -> None:
        await self._client.close()
