"""Tool retrieval for large action spaces (issue 15, point 5).

- the in-memory index finds the relevant tool among many, with the packaged MiniLM and with
  the hash embedder (deterministic), and builds each tool set's index once;
- at or below ``tool_retrieval_threshold`` the action space is every tool (the golden prompt
  tests hold it byte for byte); above it, the top ``tool_retrieval_k`` plus the runtime's
  own tools and the tools already called;
- the step log says which tools were shown (``Step.note``);
- a held tool that was not shown, named by an unconstrained planner, is validated and goes
  through the gate; one the agent does not hold, or is not granted, is refused as before.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from cortex_ray import (
    ActionType,
    AgentMode,
    Grant,
    MemorySnapshot,
    Observation,
    ObservationStatus,
    Principal,
    RunStatus,
    Runtime,
    Settings,
    ToolSpec,
    Turn,
    WorkingMemory,
)
from cortex_ray.act import Tool, ToolContext
from cortex_ray.knowledge import Analyzer, Fusion, RetrievalConfig
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import (
    ChatRequest,
    ChatResponse,
    HashEmbedder,
    ScriptedModelClient,
    ToolCall,
)
from cortex_ray.perceive import ToolIndex, ToolRetriever, always_shown, shown_note, tool_document
from cortex_ray.storage import Database


def spec(name: str, description: str, **params: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
            "required": list(params),
            "additionalProperties": False,
        },
    )


# Tools of many kinds, the way an organisation's tool catalogue reads.
CATALOGUE = [
    spec("get_weather_forecast", "Weather forecast for a city", city="the city", day="date"),
    spec("convert_currency", "Convert an amount between currencies", amount="how much"),
    spec("book_flight", "Book a plane ticket between two airports", origin="IATA code"),
    spec("cancel_hotel_booking", "Cancel a hotel reservation", booking_id="the reservation"),
    spec("send_email", "Send an email message to a recipient", to="address", body="text"),
    spec("create_calendar_event", "Add a meeting to the calendar", title="what", when="time"),
    spec("translate_text", "Translate text into another language", text="", target="language"),
    spec("calculate_mortgage", "Monthly payment of a home loan", principal="loan amount"),
    spec("get_stock_price", "Latest share price of a listed company", ticker="symbol"),
    spec("search_recipes", "Find cooking recipes by ingredient", ingredient="what to cook"),
    spec("track_package", "Where a parcel shipment is now", tracking_number="carrier's id"),
    spec("play_music", "Play a song or playlist on the speaker", song="title"),
    spec("set_alarm", "Wake-up alarm at a given time", time="hh:mm"),
    spec("order_pizza", "Order a pizza for delivery", size="small, medium or large"),
    spec("find_restaurant", "Restaurants near a place by cuisine", cuisine="e.g. thai"),
    spec("get_directions", "Driving directions from one address to another", origin="start"),
    spec("check_bank_balance", "Balance of a bank account", account="account number"),
    spec("reset_password", "Reset a user's account password", username="the login"),
    spec("compute_bmi", "Body mass index from height and weight", height="cm", weight="kg"),
    spec("get_news_headlines", "Top news stories of the day by topic", topic="e.g. sport"),
    spec("solve_quadratic", "Roots of a quadratic equation ax^2+bx+c", a="", b="", c=""),
    spec("rent_car", "Reserve a rental car at a pickup location", location="where"),
    spec("water_plants", "Start the garden irrigation system", zone="garden zone"),
    spec("scan_document", "Scan a paper page to PDF", resolution="dpi"),
    spec("summarize_article", "Summarise a long web article", url="the article's address"),
]

QUESTIONS = {
    "Will it rain in Lisbon tomorrow?": "get_weather_forecast",
    "How many euros do I get for 300 US dollars?": "convert_currency",
    "Reserve me a seat on a plane from Boston to Denver": "book_flight",
    "Where is my parcel with tracking number 1Z999?": "track_package",
    "What is Apple's share price right now?": "get_stock_price",
    "Put a meeting with Dana in my calendar for Monday at 10": "create_calendar_event",
}


def config() -> RetrievalConfig:
    return RetrievalConfig()


async def test_minilm_finds_the_tool_a_request_needs(minilm: Any) -> None:
    retriever = ToolRetriever(minilm, config(), threshold=5, k=3)
    for question, gold in QUESTIONS.items():
        found = [t.name for t in await retriever.retrieve(CATALOGUE, question, 3)]
        assert gold in found, (question, found)


async def test_minilm_dense_alone_ranks_a_paraphrase_first(minilm: Any) -> None:
    # No word of the request is in the tool's document: only the embedder can find it.
    index = ToolIndex(
        [tool_document(t) for t in CATALOGUE],
        await minilm.embed([tool_document(t) for t in CATALOGUE]),
        Analyzer.configured(config()),
    )
    vector = (await minilm.embed(["Am I overweight?"]))[0]
    assert index.bm25("Am I overweight?", 5) == []
    assert CATALOGUE[index.dense(vector, 1)[0][0]].name == "compute_bmi"


def test_tool_document_is_name_description_and_parameter_lines() -> None:
    tool = ToolSpec(
        name="get_weather_forecast",
        description=" Weather forecast for a city ",
        parameters={
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city"},
                "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "days": {"type": "array", "items": {"type": "integer"}, "maximum": 7},
                "where": {
                    "type": "object",
                    "properties": {"lat": {"type": "number", "description": "latitude"}},
                },
            },
        },
    )
    assert tool_document(tool) == (
        "get_weather_forecast\n"
        "Weather forecast for a city\n"
        "city (string): the city\n"
        "units (string): one of: c, f; default: c\n"
        "days (array of integer): maximum: 7\n"
        "where (object)\n"
        "where.lat (number): latitude"
    )


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(384)
        self.texts = 0

    async def embed(self, texts: list[str]) -> Any:
        self.texts += len(texts)
        return await super().embed(texts)


async def test_hash_embedder_bm25_and_identifier_parts_find_the_tool() -> None:
    embedder = CountingEmbedder()
    retriever = ToolRetriever(embedder, config(), threshold=5, k=1)
    # "currency" and "convert" are parts of convert_currency's name and its description.
    (first,) = await retriever.retrieve(CATALOGUE, "convert this currency amount", 1)
    assert first.name == "convert_currency"
    # BM25 alone: the exact name, and its parts, are terms (the identifier analyzer).
    index = await retriever.index([tool_document(t) for t in CATALOGUE])
    for query in ("call solve_quadratic for me", "a quadratic to solve"):
        ((best, _), *_) = index.bm25(query, 3)
        assert CATALOGUE[best].name == "solve_quadratic", query
    # The tool set's vectors were made once; each query costs one more.
    assert embedder.texts == len(CATALOGUE) + 1
    # Another set sharing all but one tool embeds only the new one.
    more = [*CATALOGUE, spec("feed_cat", "Fill the cat's bowl", grams="food")]
    (first,) = await retriever.retrieve(more, "feed the cat", 1)
    assert first.name == "feed_cat"
    assert embedder.texts == len(CATALOGUE) + 1 + 1 + 1


@pytest.mark.parametrize("fusion", list(Fusion))
async def test_every_fusion_method_ranks_the_named_tool_first(fusion: Fusion) -> None:
    cfg = RetrievalConfig(fusion=fusion, bm25_weight=0.5)
    retriever = ToolRetriever(HashEmbedder(384), cfg, threshold=5, k=1)
    (first,) = await retriever.retrieve(CATALOGUE, "water the plants in zone 2", 1)
    assert first.name == "water_plants"


def test_bm25_scores_are_the_lucene_formula() -> None:
    docs = ["alpha beta", "alpha alpha gamma", "delta"]
    index = ToolIndex(docs, np.eye(3, 384, dtype=np.float32), Analyzer())
    n, avgdl = 3, (2 + 3 + 1) / 3

    def score(tf: int, dl: int, df: int) -> float:
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
        return float(idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl)))

    ranked = dict(index.bm25("alpha gamma", 3))
    assert set(ranked) == {0, 1}
    assert ranked[1] == pytest.approx(score(2, 3, 2) + score(1, 3, 1))
    assert ranked[0] == pytest.approx(score(1, 2, 2))


async def test_threshold_decides_whether_retrieval_applies() -> None:
    retriever = ToolRetriever(HashEmbedder(384), config(), threshold=10, k=2)
    ten = CATALOGUE[:10]
    shown, hidden = await retriever.shown(ten, "weather in Lisbon", {"track_package"})
    assert shown == tuple(ten) and hidden == ()  # at the threshold: everything, unchanged

    eleven = CATALOGUE[:11]
    shown, hidden = await retriever.shown(eleven, "weather forecast in Lisbon", {"track_package"})
    names = [t.name for t in shown]
    # k retrieved, plus the kept one; listed in the held order, not by score
    assert len(shown) == 3 and "get_weather_forecast" in names and "track_package" in names
    assert names == [t.name for t in eleven if t.name in names]
    assert {t.name for t in shown} | {t.name for t in hidden} == {t.name for t in eleven}
    assert not {t.name for t in shown} & {t.name for t in hidden}
    note = shown_note(shown, hidden)
    assert note is not None and note.startswith("tools shown: 3 of 11 (tool retrieval): ")
    assert shown_note(ten, ()) is None


def test_always_shown_keeps_the_runtimes_tools_and_those_already_called() -> None:
    called = Observation(
        tool="book_flight",
        action_type=ActionType.GROUNDING,
        status=ObservationStatus.OK,
        summary="ok",
    )
    turn = Turn(role="tool", content="12 EUR", tool="convert_currency")
    autonomous = always_shown(AgentMode.AUTONOMOUS, [called], [])
    interactive = always_shown(AgentMode.INTERACTIVE, [], [turn])
    runtime_tools = {"current_time", "memory_search", "remember_fact", "knowledge_search"}
    assert runtime_tools <= autonomous and runtime_tools <= interactive
    assert "reply" in interactive and "reply" not in autonomous  # a run finishes by its answer
    assert "book_flight" in autonomous and "convert_currency" in interactive


def test_hidden_tools_stay_out_of_a_recording() -> None:
    wm = WorkingMemory(
        mode=AgentMode.AUTONOMOUS,
        agent_name="a",
        persona="",
        objective="o",
        snapshot=MemorySnapshot(query="o"),
        action_space=tuple(CATALOGUE[:2]),
        hidden_tools=tuple(CATALOGUE[2:]),
    )
    dumped = wm.model_dump(mode="json")
    assert "hidden_tools" not in dumped and len(dumped["action_space"]) == 2
    assert wm.model_copy(update={"observations": ()}).hidden_tools == tuple(CATALOGUE[2:])


# --- the cycle, on the real PostgreSQL ------------------------------------------------------


def catalogue_tools(calls: list[str]) -> list[Tool]:
    def handler(name: str) -> Callable[[ToolContext, dict[str, Any]], Any]:
        async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
            calls.append(name)
            return f"{name} done"

        return run

    return [
        Tool(
            name=t.name, description=t.description, handler=handler(t.name), parameters=t.parameters
        )
        for t in CATALOGUE
    ]


@pytest.fixture
async def make_runtime(db: Database, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Runtime] = []

    async def make(model: Any, calls: list[str], **overrides: Any) -> Runtime:
        update = {
            "embedding_backend": "hash",
            "tool_retrieval_threshold": 12,
            "tool_retrieval_k": 3,
            "structured_retries": 1,
            **overrides,
        }
        runtime = await Runtime.open(
            settings.model_copy(update=update),
            model=model,
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            db=db,
            tools=catalogue_tools(calls),
        )
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        await runtime.close(close_db=False)


def proposal_tools(request: ChatRequest) -> list[str]:
    assert request.response_schema is not None
    options = request.response_schema["properties"]["candidates"]["items"]["anyOf"]
    return [o["properties"]["tool"]["const"] for o in options if "tool" in o["properties"]]


def scripted(plan: list[dict[str, Any]]) -> ScriptedModelClient:
    """An unconstrained planner (it may name any tool): ``plan[i]`` is step i's proposal."""
    step = {"n": -1}

    def respond(request: ChatRequest) -> str:
        if request.schema_name == "proposals":
            step["n"] += 1
        return json.dumps({"candidates": [plan[min(step["n"], len(plan) - 1)]]})

    return ScriptedModelClient(responder=respond, supports_json_schema=False)


HELD = [t.name for t in CATALOGUE]
GOAL = "Will it rain in Lisbon tomorrow? Check the weather forecast."


async def test_above_the_threshold_the_prompt_shows_retrieved_and_kept_tools(
    make_runtime: Any, org: str
) -> None:
    model = scripted(
        [
            {
                "tool": "get_weather_forecast",
                "args": {"city": "Lisbon", "day": "tomorrow"},
                "rationale": "the forecast",
            },
            {"tool": "set_alarm", "args": {"time": "07:00"}, "rationale": "wake early"},
            {"finish": True, "message": "Rain is forecast.", "rationale": "done"},
        ]
    )
    calls: list[str] = []
    runtime = await make_runtime(model, calls)
    tools = [*HELD, "current_time", "memory_search", "remember_fact"]
    agent = await runtime.create_agent(org, "many", mode=AgentMode.AUTONOMOUS, tools=tools)
    run = await runtime.run_autonomous(org, agent.id, GOAL, max_steps=4)
    assert run.status is RunStatus.COMPLETED, run.reason
    assert calls == ["get_weather_forecast", "set_alarm"]

    asked = [proposal_tools(r) for r in model.requests if r.schema_name == "proposals"]
    first = set(asked[0])
    assert "get_weather_forecast" in first
    assert {"current_time", "memory_search", "remember_fact"} <= first  # the runtime's own
    assert len(first) == 3 + 3 and len(asked[0]) == len(first)  # k = 3, plus those three
    # set_alarm was not shown for this objective, yet the planner named it: held, so
    # validated and dispatched; from then on it is shown (the run called it).
    assert "set_alarm" not in first
    assert "set_alarm" in asked[2] and "get_weather_forecast" in asked[2]

    # The step log says what each step was shown; the stored log is the returned one.
    stored = await runtime.store.get_run(org, run.id)
    assert stored == run
    note = run.steps[0].note or ""
    assert f"tools shown: 6 of {len(tools)} (tool retrieval): " in note
    shown = note.rsplit("(tool retrieval): ", 1)[1].split(", ")
    assert sorted(shown) == sorted(asked[0])
    assert "set_alarm" in (run.steps[2].note or "")  # the finish step's note too

    audit = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert [(a["tool"], a["status"]) for a in audit] == [
        ("get_weather_forecast", "OK"),
        ("set_alarm", "OK"),
    ]


async def test_a_tool_the_agent_does_not_hold_is_refused_as_before(
    make_runtime: Any, org: str
) -> None:
    calls: list[str] = []
    model = scripted([{"tool": "order_pizza", "args": {"size": "large"}, "rationale": "food"}])
    runtime = await make_runtime(model, calls)
    # order_pizza is registered in the runtime but not in this agent's tool set.
    tools = [n for n in HELD if n != "order_pizza"]
    agent = await runtime.create_agent(org, "no-pizza", mode=AgentMode.AUTONOMOUS, tools=tools)
    run = await runtime.run_autonomous(org, agent.id, "Order a large pizza", max_steps=2)
    assert run.status is RunStatus.FAILED
    assert "unknown tool 'order_pizza'" in (run.reason or "")
    assert calls == []
    assert await runtime.store.audit_rows(org, run_id=run.id, gate_only=True) == []


async def test_a_held_tool_without_a_grant_is_neither_shown_nor_run(
    make_runtime: Any, org: str
) -> None:
    calls: list[str] = []
    model = scripted([{"tool": "order_pizza", "args": {"size": "large"}, "rationale": "food"}])
    runtime = await make_runtime(model, calls)
    grant = Grant(tools=frozenset(n for n in HELD if n != "order_pizza"))
    agent = await runtime.create_agent(
        org, "held-not-granted", mode=AgentMode.AUTONOMOUS, tools=HELD, grant=grant
    )
    run = await runtime.run_autonomous(org, agent.id, "Order a large pizza", max_steps=2)
    assert run.status is RunStatus.FAILED
    assert "unknown tool 'order_pizza'" in (run.reason or "")
    assert calls == []
    asked = [proposal_tools(r) for r in model.requests if r.schema_name == "proposals"]
    assert asked and all("order_pizza" not in names for names in asked)


async def test_at_the_threshold_every_tool_is_shown_and_the_note_is_unchanged(
    make_runtime: Any, org: str
) -> None:
    calls: list[str] = []
    model = scripted([{"finish": True, "message": "Nothing to do.", "rationale": "done"}])
    runtime = await make_runtime(model, calls, tool_retrieval_threshold=len(HELD))
    agent = await runtime.create_agent(org, "all", mode=AgentMode.AUTONOMOUS, tools=HELD)
    run = await runtime.run_autonomous(org, agent.id, GOAL, max_steps=1)
    (asked,) = [proposal_tools(r) for r in model.requests if r.schema_name == "proposals"]
    assert sorted(asked) == sorted(HELD)
    assert "tools shown" not in (run.steps[0].note or "")


async def test_interactive_turn_shows_reply_and_gates_a_held_unshown_call(
    make_runtime: Any, org: str
) -> None:
    call = ChatResponse(
        tool_calls=(ToolCall(id="c-1", name="set_alarm", arguments='{"time": "07:00"}'),),
        finish_reason="tool_calls",
    )
    model = ScriptedModelClient([call, "Your alarm is set."])
    calls: list[str] = []
    runtime = await make_runtime(model, calls)
    agent = await runtime.create_agent(org, "helper", tools=[*HELD, "reply", "current_time"])
    alice = Principal(id="alice", org_id=org, name="Alice", grant=Grant(tools=frozenset({"*"})))
    session = await runtime.open_session(org, agent.id, alice)
    result = await runtime.run_turn(session, alice, "What is the weather forecast in Lisbon?")
    offered = {t["function"]["name"] for t in model.requests[0].tools}
    assert "get_weather_forecast" in offered and "current_time" in offered
    assert "set_alarm" not in offered and len(offered) == 3 + 1  # k, and the runtime's own
    # The chat model called a held tool it was not offered: the gate ran it.
    assert calls == ["set_alarm"]
    assert [o.status for o in result.observations] == [ObservationStatus.OK]
    assert result.reply == "Your alarm is set."
    audit = await runtime.store.audit_rows(org, gate_only=True)
    assert [a["tool"] for a in audit] == ["set_alarm", "reply"]


# --- the agent benchmark's large action space (bench/agent_eval.py --distractors) -----------


def _bench(name: str) -> Any:
    from bench_modules import load_bench

    return load_bench(name)


def test_distractors_are_other_functions_drawn_the_same_way_every_time() -> None:
    bfcl = _bench("_bfcl")
    data = bfcl.bfcl_data_dir()
    if data is None:
        pytest.skip("no BFCL data: pip install --no-deps bfcl-eval==2026.3.23")
    agent_eval = _bench("agent_eval")
    cases = bfcl.load_cases(data, "multiple")[:3]
    once = agent_eval.with_distractors(cases, data, 200, 0)
    assert once == agent_eval.with_distractors(cases, data, 200, 0)
    assert once != agent_eval.with_distractors(cases, data, 200, 1)
    for case, extended in zip(cases, once, strict=True):
        assert extended.functions[: len(case.functions)] == case.functions
        names = [f["name"] for f in extended.functions]
        assert len(names) == len(case.functions) + 200 == len(set(names))
        assert extended.answers == case.answers
