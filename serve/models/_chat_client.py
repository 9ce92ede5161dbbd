"""The core's ``ModelClient`` over the ``LLM`` deployment's handle, for code inside the
cluster: a model call that meets a full line waits for its turn's or run's own deadline,
and the client reports the model's capacity to admission."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Literal

from cortex_ray import ModelError
from cortex_ray.models import (
    ChatRequest,
    ChatResponse,
    Deadline,
    ModelCapacity,
    ToolCall,
    Usage,
    current_deadline,
)
from serve.models._chat_backends import chat_backend
from serve.models._openai import ChatCompletionRequest, Failure

try:
    from ray import serve as ray_serve
    from ray.exceptions import RayError
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("model serving needs Ray Serve: pip install 'cortex-ray[ray]'") from exc

__all__ = ["HandleModelClient", "answer_within"]

log = logging.getLogger("serve.models.handles")

_CAPACITY_FRESH_S = 2.0
"""How long a capacity report is reused (admission asks on every accepted turn or run)."""
_REPLICAS_FRESH_S = 15.0
"""How long a count of the deployment's running replicas is reused (asks the controller)."""
_LOAD_TIMEOUT_S = 5.0


async def answer_within(response: Any, timeout_s: float | None, what: str) -> Any:
    """The result of a handle call, waited for at most ``timeout_s`` (``None``: no bound).

    A deployment whose replicas are gone (their node died, or it cannot be placed) leaves a
    handle call waiting for a replica with no end: the bound turns that into a ``ModelError``
    (the request is cancelled), and so does a replica that died under the call, so a run
    that depends on the model ends instead of hanging."""
    try:
        if timeout_s is None:
            return await response
        return await asyncio.wait_for(_awaited(response), timeout_s)
    except TimeoutError:
        cancel = getattr(response, "cancel", None)  # a DeploymentResponse; a coroutine was
        if callable(cancel):  # cancelled by wait_for, and its handle call with it
            cancel()
        raise ModelError(f"{what}: no answer within {timeout_s:g} s (model_timeout_s)") from None
    except RayError as exc:
        raise ModelError(f"{what}: the deployment failed ({type(exc).__name__})") from exc


async def _awaited(response: Any) -> Any:
    return await response


class HandleModelClient:
    """Chats through the ``LLM`` deployment (llama.cpp or Ray Serve LLM) in the OpenAI
    chat-completions format; schemas go as ``response_format``, as over HTTP.

    Inside accepted work (a turn, a run's step: ``cortex_ray.models.waiting_until``) a call
    waits in the replica's line until that work's deadline, keeping its place (``wait_s``),
    and a line that is full is tried again after ``overload_backoff_s`` doubling up to
    ``max_backoff_s``, until the deadline: then ``DeadlineExceededError`` says so. Never a
    ``ModelError`` for a full line there. Outside such work, a 503 ``model_overloaded`` is
    tried again ``overload_retries`` times, as the openai SDK does over HTTP. Background work
    (``priority`` above 0) is never retried: it has a fallback and would only add to the
    line.

    :meth:`capacity` reports what the model holds (for admission), from the replica's
    counters and the deployment's running replicas (``app_name``)."""

    def __init__(
        self,
        handle: DeploymentHandle[Any],
        model_id: str,
        *,
        backend: Literal["llama_cpp", "vllm"] = "llama_cpp",
        app_name: str | None = None,
        deployment_name: str = "LLM",
        default_temperature: float = 0.0,
        default_max_tokens: int = 512,
        overload_retries: int = 3,
        overload_backoff_s: float = 1.0,
        max_backoff_s: float = 8.0,
        timeout_s: float | None = None,
    ) -> None:
        self._backend = chat_backend(backend, handle)
        self._app = app_name
        self._deployment = deployment_name
        self._timeout_s = timeout_s
        self._overload_retries = overload_retries
        self._overload_backoff_s = overload_backoff_s
        self._max_backoff_s = max_backoff_s
        self._model = model_id
        self._temperature = default_temperature
        self._max_tokens = default_max_tokens
        self._capacity: tuple[float, ModelCapacity | None] | None = None
        self._replicas: tuple[float, int] | None = None

    @property
    def name(self) -> str:
        return self._model

    @property
    def supports_json_schema(self) -> bool:
        return True

    def _body(self, request: ChatRequest) -> ChatCompletionRequest:
        body = request.to_openai(
            self._model,
            default_temperature=self._temperature,
            default_max_tokens=self._max_tokens,
        )
        if request.priority:  # our own deployment's line honours it (to_openai leaves it out)
            body["priority"] = request.priority
        try:
            return ChatCompletionRequest.model_validate(json.loads(json.dumps(body)))
        except ValueError as exc:
            raise ModelError(f"{self._model}: the request is not valid: {exc}") from exc

    async def chat(self, request: ChatRequest) -> ChatResponse:
        body = self._body(request)
        deadline = current_deadline()
        if deadline is not None:
            result = await self._until(body, deadline)
        else:
            result = await self._retried(
                body, self._overload_retries if request.priority <= 0 else 0
            )
        choice = result["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"] or "{}"
            )
            for c in message.get("tool_calls") or ()
            if c.get("type", "function") == "function"
        )
        usage = result.get("usage") or {}
        return ChatResponse(
            content=message.get("content"),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
            ),
        )

    async def _until(self, body: ChatCompletionRequest, deadline: Deadline) -> dict[str, Any]:
        """The answer, waiting for a model over capacity until ``deadline``."""
        delay = self._overload_backoff_s
        tries = 0
        while True:
            left = deadline.left()
            if left <= 0:
                raise deadline.exceeded(
                    f"the model {self._model}, over capacity ({tries} tries)"
                    if tries
                    else f"the model {self._model}"
                )
            tries += 1
            # The replica keeps the call in its line until the deadline; the bound on the
            # answer adds the generation's own (model_timeout_s).
            bound = None if self._timeout_s is None else left + self._timeout_s
            result: dict[str, Any] | Failure = await answer_within(
                self._backend.chat(body, left), bound, self._model
            )
            if not isinstance(result, Failure):
                return result
            if result.code != "model_overloaded":
                raise ModelError(f"{self._model}: {result.message}")
            pause = min(delay, max(deadline.left(), 0.0))
            log.info(
                "%s over capacity; trying again in %.1f s (%s)", self._model, pause, result.message
            )
            await asyncio.sleep(pause)
            delay = min(delay * 2, self._max_backoff_s)

    async def _retried(self, body: ChatCompletionRequest, retries: int) -> dict[str, Any]:
        """The answer, a full line tried again ``retries`` times (backing off)."""
        delay = self._overload_backoff_s
        for attempt in range(retries + 1):
            result: dict[str, Any] | Failure = await answer_within(
                self._backend.chat(body), self._timeout_s, self._model
            )
            if not isinstance(result, Failure):
                return result
            if result.code != "model_overloaded" or attempt == retries:
                raise ModelError(f"{self._model}: {result.message}")
            log.info("%s over capacity; trying again in %.1f s", self._model, delay)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def capacity(self) -> ModelCapacity | None:
        """What the model holds at once over its replicas (``ModelCapacity``), from one
        replica's counters (reused for a few seconds; the last report when the replica does
        not answer in time); ``None`` when the backend reports none (vLLM) or nothing was
        ever read."""
        now = time.monotonic()
        if self._capacity is not None and now - self._capacity[0] < _CAPACITY_FRESH_S:
            return self._capacity[1]
        try:
            load = await answer_within(self._backend.load(), _LOAD_TIMEOUT_S, self._model)
        except ModelError:
            log.warning("%s: its load could not be read", self._model, exc_info=True)
            load = None
        if load is None and self._capacity is not None:
            # A replica too busy to answer in time is no reason to admit without a limit.
            return self._capacity[1]
        found = None
        if load is not None:
            replicas = await self._running_replicas()
            found = ModelCapacity(
                slots=replicas * (1 + int(load["max_waiting"])),
                waiting=int(load["waiting"]) * replicas,
                replicas=replicas,
                mean_request_s=float(load.get("mean_request_s", 0.0)),
            )
        self._capacity = (now, found)
        return found

    async def _running_replicas(self) -> int:
        """RUNNING replicas of the deployment (asked of the controller, reused a while; 1
        when it cannot tell)."""
        now = time.monotonic()
        if self._replicas is not None and now - self._replicas[0] < _REPLICAS_FRESH_S:
            return self._replicas[1]
        count = 1
        if self._app is not None:
            try:
                status = await asyncio.to_thread(ray_serve.status)
                app = status.applications.get(self._app)
                deployment = None if app is None else app.deployments.get(self._deployment)
                if deployment is not None:
                    states = {
                        str(getattr(k, "value", k)): v for k, v in deployment.replica_states.items()
                    }
                    count = max(1, int(states.get("RUNNING", 1)))
            except Exception:
                log.warning("the replicas of %s could not be counted", self._model, exc_info=True)
        self._replicas = (now, count)
        return count

    async def aclose(self) -> None:
        """Nothing to close: the deployment outlives its callers."""
