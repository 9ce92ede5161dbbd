"""Structured output that never breaks (issue 14, point 5).

What was seen through the API, each pinned here: raw control characters that the grammar
let through and ``json.loads`` refused; a duplicated lead-in ("The final answer is: The
final answer is: ...") and unrendered placeholders ("It's currently {{current_time}}.")
accepted as answers; interactive agents that never called a tool; a reply cut at the token
limit that leaked the grammar's ``{"reply": ...`` wrapper into ``content``; ``stop``
refused on the llama.cpp backend. Where the behaviour is the model's, the packaged SmolLM2
runs through llama.cpp; where it is a parser's, a scripted model feeds it.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import pytest
from test_composer import WHEN, working_memory

from cortex_ray import (
    ActionType,
    AgentMode,
    DecisionKind,
    MemorySnapshot,
    Observation,
    ObservationStatus,
    Settings,
    ToolSpec,
    Turn,
)
from cortex_ray.decide import AutonomousDriver, InteractiveDriver
from cortex_ray.decide._answers import claims_a_write, placeholder_note, placeholders
from cortex_ray.models import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ScriptedModelClient,
    ToolCall,
    Usage,
    structured_call,
)
from cortex_ray.models.llama_cpp import decode_tool_choice, json_schema_grammar
from cortex_ray.perceive import PromptComposer

MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "maxLength": 40}},
    "required": ["message"],
    "additionalProperties": False,
}


def grammar_accepts(llama: Any, grammar: str, text: str) -> bool:
    """Whether llama.cpp's own grammar sampler lets ``text`` through, token by token (the
    model's tokenizer; no generation)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llama._model.model)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp could not parse the grammar"
    try:
        for token in llama.tokenize(text.encode(), add_bos=False, special=False):
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if data[0].logit == float("-inf"):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


# --- 1. control characters ----------------------------------------------------------------


def test_llama_cpp_python_grammar_admits_raw_control_characters(smollm2: Any) -> None:
    """Why we do not hand llama-cpp-python the schema (``response_format``): its grammar
    lets a raw newline into a string. If this starts failing, the library fixed it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    theirs = json_schema_to_gbnf(json.dumps(MESSAGE_SCHEMA))
    assert grammar_accepts(smollm2._llama, theirs, '{"message": "two\nlines"}')


def test_our_grammar_refuses_raw_control_characters_and_keeps_escapes(smollm2: Any) -> None:
    request = ChatRequest(
        messages=(ChatMessage(role="user", content="hi"),), response_schema=MESSAGE_SCHEMA
    )
    grammar = smollm2._prepare(request)["grammar"]._grammar  # what llama.cpp decodes under
    assert "response_format" not in smollm2._prepare(request)
    for raw in ('{"message": "two\nlines"}', '{"message": "a\tb"}', '{"message": "\x01"}'):
        assert not grammar_accepts(smollm2._llama, grammar, raw), repr(raw)
    for ok in ('{"message": "two\\nlines"}', '{"message": "caf\u00e9 \\u0001 \\"q\\""}'):
        assert grammar_accepts(smollm2._llama, grammar, ok), ok
        json.loads(ok)  # what the grammar admits, json.loads reads
    tools = ({"type": "function", "function": {"name": "f", "parameters": MESSAGE_SCHEMA}},)
    with_tools = smollm2._prepare(ChatRequest(messages=request.messages, tools=tools))
    assert not grammar_accepts(smollm2._llama, with_tools["grammar"]._grammar, '{"reply": "a\nb"}')


def test_a_pattern_dot_cannot_break_the_json_string(smollm2: Any) -> None:
    grammar = json_schema_grammar(
        {"type": "object", "properties": {"code": {"type": "string", "pattern": "^a.c$"}}}
    )
    assert grammar_accepts(smollm2._llama, grammar, '{"code": "abc"}')
    assert not grammar_accepts(smollm2._llama, grammar, '{"code": "a\nc"}')
    assert not grammar_accepts(smollm2._llama, grammar, '{"code": "a"c"}')


async def test_structured_call_reads_control_characters_an_unconstrained_backend_sent() -> None:
    model = ScriptedModelClient(['{"message": "two\nlines"}'])
    got = await structured_call(
        model,
        [ChatMessage(role="user", content="x")],
        schema=MESSAGE_SCHEMA,
        validate=lambda raw: raw["message"],
        schema_name="m",
        retries=0,
    )
    assert got == "two\nlines"


# --- 2. duplicated lead-ins and unrendered placeholders ------------------------------------


TIME = ToolSpec(
    name="current_time",
    description="Read the current date and time (UTC).",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    action_type=ActionType.GROUNDING,
)


def finish(message: str) -> str:
    return json.dumps({"candidates": [{"finish": True, "message": message, "rationale": "r"}]})


def autonomous_wm() -> Any:
    return working_memory(AgentMode.AUTONOMOUS, action_space=(TIME,), max_steps=4)


async def test_a_repeated_lead_in_is_said_once_in_a_result_and_a_reply() -> None:
    model = ScriptedModelClient([finish("The final answer is: The final answer is: 42")])
    decision = await AutonomousDriver(model, PromptComposer(), Settings().decide).decide(
        autonomous_wm()
    )
    assert decision.kind is DecisionKind.FINISH
    assert decision.message == "The final answer is: 42"

    model = ScriptedModelClient(["Answer: answer:  Sunday."])
    decision = await InteractiveDriver(model, PromptComposer()).decide(chat_wm("Day?"))
    assert decision.message == "Answer: Sunday."


async def test_a_result_with_a_placeholder_is_refused_and_asked_again() -> None:
    model = ScriptedModelClient([finish("It is {{current_time}}."), finish("It is 09:30 UTC.")])
    decision = await AutonomousDriver(model, PromptComposer(), Settings().decide).decide(
        autonomous_wm()
    )
    assert decision.message == "It is 09:30 UTC."
    note = model.requests[1].messages[-1].content or ""
    assert "{{current_time}}" in note and "call the tool current_time" in note


def chat_wm(question: str, **overrides: Any) -> Any:
    """An agent as ``create_agent`` makes it: no persona, every built-in tool, in a chat."""
    return working_memory(
        AgentMode.INTERACTIVE,
        agent_name="helper",
        persona="",
        skills=(),
        conversation=(Turn(role="user", content=question),),
        snapshot=MemorySnapshot(query=question, taken_at=WHEN),
        **overrides,
    )


def call(name: str, finish: str = "tool_calls", arguments: str = "{}") -> ChatResponse:
    return ChatResponse(
        tool_calls=(ToolCall(id="c1", name=name, arguments=arguments),), finish_reason=finish
    )


async def test_a_reply_with_a_placeholder_never_reaches_the_person() -> None:
    # The slot of a tool that takes no arguments: the model said which value it needs, so
    # the call is made (Qwen 1.5B wrote "[insert current date and time]" twice when asked
    # again, and the person got a refusal).
    for reply in ("It's currently {{current_time}}.", "It is [insert current date and time]."):
        model = ScriptedModelClient([reply])
        driver = InteractiveDriver(model, PromptComposer())
        decision = await driver.decide(chat_wm("What time is it?"))
        assert decision.kind is DecisionKind.ACT and decision.action is not None
        assert decision.action.tool == "current_time" and decision.action.args == {}
        assert "the value current_time gives: called it" in decision.reason
        assert len(model.requests) == 1

    # A tool that needs arguments: asked again with a note naming the tool.
    model = ScriptedModelClient(
        ["I searched: [memory_search].", call("memory_search", arguments='{"query": "cat"}')]
    )
    driver = InteractiveDriver(model, PromptComposer())
    decision = await driver.decide(chat_wm("What is my cat called?"))
    assert decision.action is not None and decision.action.tool == "memory_search"
    retry = model.requests[1].messages
    assert retry[-2].content == "I searched: [memory_search]."
    assert "call the tool memory_search" in (retry[-1].content or "")

    # twice: refused with the reason, nothing to send
    model = ScriptedModelClient(["It is {{ time }}.", "Still {{time}}."])
    decision = await InteractiveDriver(model, PromptComposer()).decide(chat_wm("Time?"))
    assert decision.failed and decision.message is None
    assert "{{time}}" in decision.reason and len(model.requests) == 2


async def test_a_reply_that_claims_a_write_no_tool_made_is_sent_back_once() -> None:
    """Qwen 1.5B answered "I have stored the fact that your cat is called Tom" without
    calling remember_fact: nothing was stored."""
    said = "I have stored the fact that your cat is called Tom in my long-term memory."
    fact = '{"subject": "cat", "fact": "the cat is called Tom"}'
    model = ScriptedModelClient([said, call("remember_fact", arguments=fact)])
    driver = InteractiveDriver(model, PromptComposer())
    decision = await driver.decide(chat_wm("My cat is called Tom. Remember that."))
    assert decision.action is not None and decision.action.tool == "remember_fact"
    note = model.requests[1].messages[-1].content or ""
    assert "nothing is stored" in note and "remember_fact" in note
    # After a memory tool ran this turn, the same words are the reply.
    stored = Observation(
        tool="remember_fact",
        action_type=ActionType.LEARNING,
        status=ObservationStatus.OK,
        summary='{"remembered": true}',
    )
    model = ScriptedModelClient([said])
    decision = await InteractiveDriver(model, PromptComposer()).decide(
        chat_wm("My cat is called Tom. Remember that.", observations=(stored,))
    )
    assert decision.kind is DecisionKind.REPLY and decision.message == said
    assert len(model.requests) == 1
    assert not claims_a_write("I cannot store that.") and claims_a_write("I'll remember it.")


async def test_a_tool_call_cut_at_the_token_limit_is_refused() -> None:
    model = ScriptedModelClient([call("remember_fact", "length", '{"subject": "ca')])
    decision = await InteractiveDriver(model, PromptComposer()).decide(chat_wm("x"))
    assert decision.failed and decision.action is None
    assert "cut off at the token limit" in decision.reason


async def test_tool_arguments_with_raw_control_characters_are_read() -> None:
    model = ScriptedModelClient([call("remember_fact", arguments='{"fact": "a\nb"}')])
    decision = await InteractiveDriver(model, PromptComposer()).decide(chat_wm("x"))
    assert decision.action is not None and decision.action.args == {"fact": "a\nb"}


# --- 3. interactive agents call tools --------------------------------------------------------


class Counting:
    def __init__(self, inner: Any) -> None:
        self.inner, self.requests = inner, []
        self.name, self.supports_json_schema = inner.name, True

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        response: ChatResponse = await self.inner.chat(request)
        return response

    async def aclose(self) -> None: ...


async def test_the_packaged_model_calls_the_tool_a_question_needs(smollm2: Any) -> None:
    """With ``reply`` listed as a tool in the prompt beside the tool grammar's own
    {"reply": ...}, SmolLM2 answered "It's currently {{current_time}}." to this question
    (the prompt's action space no longer lists it in a conversation). Its first answer
    must be the call: no retry note helped."""
    model = Counting(smollm2)
    wm = chat_wm("What time is it?")
    assert "reply" in {t.name for t in wm.action_space}  # the agent may reply...
    decision = await InteractiveDriver(model, PromptComposer()).decide(wm)
    system = model.requests[0].messages[0].content or ""
    assert "- reply:" not in system  # ...but a reply is not listed as a tool to call
    assert decision.kind is DecisionKind.ACT and decision.action is not None
    assert decision.action.tool == "current_time"
    assert len(model.requests) == 1


def test_the_interactive_action_space_leaves_out_the_reply_but_keeps_the_tools() -> None:
    composer = PromptComposer()
    chat = composer.action_space_block(chat_wm("hi"))
    assert "- current_time:" in chat and "- reply:" not in chat
    alone = working_memory(AgentMode.AUTONOMOUS, action_space=chat_wm("hi").action_space)
    assert "- reply(message: string):" in composer.action_space_block(
        alone
    )  # only a conversation drops it


# --- 4. a reply cut at the token limit on the tools route ------------------------------------


def test_a_cut_off_tool_grammar_output_never_returns_its_wrapper() -> None:
    usage = Usage()
    got = decode_tool_choice('{ "reply": "Hello there, how a', "length", usage)
    assert (got.content, got.finish_reason) == ("Hello there, how a", "length")
    got = decode_tool_choice('{"reply": "say \\"hi\\" caf\\u00', "length", usage)
    assert got.content == 'say "hi" caf'  # a half escape is dropped
    got = decode_tool_choice('{ "tool": "get_weather", "arguments": {"city": "Par', "length", usage)
    assert got.finish_reason == "length" and got.content is None
    assert got.tool_calls[0].name == "get_weather"
    assert got.tool_calls[0].arguments == '{"city": "Par'  # as far as it got, as OpenAI does
    got = decode_tool_choice('{ "re', "length", usage)
    assert (got.content, got.finish_reason) == ("", "length")
    got = decode_tool_choice('{"reply": "done"}', "stop", usage)
    assert (got.content, got.finish_reason) == ("done", "stop")


def server() -> Any:
    from cortex_ray.models import TEST_MODEL_NAME
    from serve.models import LlmConfig
    from serve.models._llm import LlamaCppServer

    return LlamaCppServer(LlmConfig(model_id=TEST_MODEL_NAME))


def body(**fields: Any) -> Any:
    from serve.models._openai import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "m", "temperature": 0.0, **fields})


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
GREET = [{"role": "user", "content": "Say hello to me."}]


@pytest.fixture(scope="module")
def replica() -> Any:
    return server()


async def test_a_reply_cut_at_the_token_limit_leaks_no_wrapper(replica: Any) -> None:
    """The OpenAI route (what LangChain's ``bind_tools().invoke`` reads) with the packaged
    SmolLM2: a reply cut at max_tokens is what it held of the reply, finish "length"."""
    result = await replica.chat(body(messages=GREET, tools=[WEATHER], max_tokens=12))
    choice = result["choices"][0]
    content = choice["message"]["content"]
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")
    assert content and '"reply"' not in content and not content.lstrip().startswith("{")
    whole = await replica.chat(body(messages=GREET, tools=[WEATHER], max_tokens=120))
    assert whole["choices"][0]["message"]["content"].startswith(content)


# --- 5. stop on the llama.cpp backend ---------------------------------------------------------


COUNT = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]


async def test_stop_ends_the_output_before_the_stop_string(replica: Any) -> None:
    free = (await replica.chat(body(messages=COUNT, max_tokens=40)))["choices"][0]
    text = free["message"]["content"]
    stop = [w for w in text.split() if text.index(w) > 0][1]  # a later word
    for value in (stop, [stop, "never-said"]):
        got = (await replica.chat(body(messages=COUNT, max_tokens=40, stop=value)))["choices"][0]
        assert (got["message"]["content"], got["finish_reason"]) == (
            text[: text.index(stop)],
            "stop",
        )
    pieces = [
        c["choices"][0]["delta"].get("content") or ""
        async for c in replica.chat_stream(
            body(messages=COUNT, max_tokens=40, stop=[stop], stream=True)
        )
        if isinstance(c, dict) and c["choices"]
    ]
    assert "".join(pieces) == text[: text.index(stop)]


async def test_stop_with_tools_applies_to_the_reply_text(replica: Any) -> None:
    free = await replica.chat(body(messages=GREET, tools=[WEATHER], max_tokens=60))
    text = free["choices"][0]["message"]["content"]
    stop = [w for w in text.split() if text.index(w) > 0][1]  # a later word
    got = await replica.chat(body(messages=GREET, tools=[WEATHER], max_tokens=60, stop=stop))
    choice = got["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (
        text[: text.index(stop)],
        "stop",
    )


def test_the_core_sends_stop_to_openai_compatible_servers() -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="x"),), stop=("\n",))
    body_ = request.to_openai("m", default_temperature=0.0, default_max_tokens=8)
    assert body_["stop"] == ["\n"]
    assert "stop" not in ChatRequest(messages=request.messages).to_openai(
        "m", default_temperature=0.0, default_max_tokens=8
    )


def test_a_tool_name_in_brackets_is_a_placeholder_and_other_brackets_are_not() -> None:
    tools = ["current_time", "memory_search"]
    assert placeholders("The time is [current_time].", tools) == ["[current_time]"]
    assert placeholders("It is {current time} now <memory-search>", tools) == [
        "{current time}",
        "<memory-search>",
    ]
    assert placeholders("See [1] and [sic], {x: 1}, <b>bold</b>", tools) == []
    # Template slots without a tool's name: a short lower-case phrase in brackets or braces.
    assert placeholders("It is [current date and time].", tools) == ["[current date and time]"]
    assert placeholders("Hello {name}, see [insert link].", ()) == ["{name}", "[insert link]"]
    # ... but not code, citations, notes or upper-case tags.
    for text in ("x = array[index]", 'f"{value}"', "[Note: checked]", "2026-12-01 [UTC]"):
        assert placeholders(text, tools) == [], text
    assert placeholders("{{anything}}", ()) == ["{{anything}}"]
    # An action category copied from the planner's progress lines stands where a value goes.
    found = placeholders("The observatory is in [RETRIEVAL] (see [GROUNDING]).", tools)
    assert found == ["[RETRIEVAL]", "[GROUNDING]"]
    assert placeholders("Status [OK], region [EU], see [RFC 9110]", tools) == []
    note = placeholder_note(["[current_time]"], tools)
    assert "call the tool current_time first" in note
    # A slot that names no tool but holds all the words of one points at it.
    note = placeholder_note(["[insert current date and time]"], tools)
    assert "call the tool current_time first" in note
    assert "call the tool" not in placeholder_note(["[your name]"], tools)


async def test_a_result_or_a_fact_holding_a_bracketed_tool_name_is_refused() -> None:
    remember = ToolSpec(
        name="remember_fact",
        description="Store a fact.",
        parameters={
            "type": "object",
            "properties": {"subject": {"type": "string"}, "fact": {"type": "string"}},
            "required": ["subject", "fact"],
            "additionalProperties": False,
        },
        action_type=ActionType.LEARNING,
    )
    stored_placeholder = json.dumps(
        {
            "candidates": [
                {
                    "tool": "remember_fact",
                    "args": {"subject": "time", "fact": "It is [current_time]."},
                    "rationale": "r",
                },
                {"finish": True, "message": "The time is [current_time].", "rationale": "r"},
            ]
        }
    )
    call_time = {"candidates": [{"tool": "current_time", "args": {}, "rationale": "r"}]}
    model = ScriptedModelClient([stored_placeholder, json.dumps(call_time)])
    wm = working_memory(AgentMode.AUTONOMOUS, action_space=(TIME, remember), max_steps=4)
    decision = await AutonomousDriver(model, PromptComposer(), Settings().decide).decide(wm)
    assert decision.action is not None and decision.action.tool == "current_time"
    note = model.requests[1].messages[-1].content or ""
    assert "fact: Your answer contained [current_time]" in note
