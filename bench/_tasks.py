"""The whole-task suite of the agent benchmark (``bench/agent_eval.py tasks``, issue 14).

Multi-step goals whose end state a deterministic verifier checks, run through the product's
own path in this process: ``Runtime.open`` with the packaged chat model, the embedded
PostgreSQL, MiniLM embeddings, the real invocation gate; autonomous tasks through
``Runtime.run_autonomous`` and conversational ones through ``open_session`` + ``run_turn``.
Each task gets a fresh agent (its own memories) in an organisation of its own per run.

Tools: the built-ins (``current_time``, ``memory_search``, ``remember_fact``, ...), the
registered ``knowledge_search`` over a small fictional corpus (bench/data/agent_corpus,
ingested once per run through ``KnowledgeWriter`` as the ingestion job does, so the facts
cannot come from the model's training), and three bench tools: ``calculate`` (arithmetic),
``lookup_price`` (a fixed price list) and ``convert_units``.

Variants run side by side in the same process with the same loaded model and database:
``planner`` (the settings' K candidates → evaluate → select) and ``first`` (K=1: take the
planner's first idea, no evaluation call), the seeds' claim being that the first loses;
``scores`` (0-10 scores instead of the default choice) and ``critic`` (the agent's inner
voice on) measure those two choices.
Reported per variant: tasks completed (verifier passed), mean steps, loops (steps that repeat
an earlier call of the same run with the same arguments), seconds per step; the ratio of
completions planner/first.

    .venv/bin/python bench/agent_eval.py tasks [--model NAME] [--tasks a,b]
                                               [--variants planner,first]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import hashlib
import json
import math
import operator
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cortex_ray import AgentMode, Runtime, Settings, load_settings
from cortex_ray._types import (
    MemoryKind,
    ObservationStatus,
    Principal,
    RunStatus,
    TaskRun,
    TurnResult,
)
from cortex_ray.act import Tool, ToolContext
from cortex_ray.evals import EvalCase, EvalSuite
from cortex_ray.knowledge import Format, KnowledgeWriter, SplitPassage, SplitSection, split_bytes
from cortex_ray.models import PACKAGED_MODELS, ModelClient, open_models

CORPUS = Path(__file__).resolve().parent / "data" / "agent_corpus"
COLLECTION = "bench-corpus"
PERSONA = "You are a careful assistant. Use your tools, then finish with a short answer."

# tools ------------------------------------------------------------------------------------

_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """Arithmetic only: numbers, + - * / ** %, parentheses (no names, no calls)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    return walk(ast.parse(expression.replace("×", "*").replace("^", "**"), mode="eval"))


def _number(value: float) -> int | float:
    return int(value) if value == int(value) and abs(value) < 1e15 else round(value, 6)


async def _calculate(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    try:
        value = evaluate(str(args["expression"]))
    except (ValueError, SyntaxError, ZeroDivisionError) as exc:
        return {"error": f"cannot evaluate {args['expression']!r}: {exc}"}
    return {"expression": args["expression"], "value": _number(value)}


PRICES = {"widget": 4.25, "gadget": 12.5, "gizmo": 7.0}


async def _lookup_price(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    product = str(args["product"]).strip().lower().rstrip("s")
    if product not in PRICES:
        return {"error": f"no such product; known: {', '.join(sorted(PRICES))}"}
    return {"product": product, "price_eur": PRICES[product]}


_CONVERSIONS = {
    ("km", "mi"): lambda v: v / 1.609344,
    ("mi", "km"): lambda v: v * 1.609344,
    ("kg", "lb"): lambda v: v / 0.45359237,
    ("lb", "kg"): lambda v: v * 0.45359237,
    ("c", "f"): lambda v: v * 9 / 5 + 32,
    ("f", "c"): lambda v: (v - 32) * 5 / 9,
}
_UNIT_NAMES = {
    "kilometre": "km",
    "kilometer": "km",
    "kilometres": "km",
    "kilometers": "km",
    "mile": "mi",
    "miles": "mi",
    "kilogram": "kg",
    "kilograms": "kg",
    "pound": "lb",
    "pounds": "lb",
    "celsius": "c",
    "fahrenheit": "f",
}


async def _convert(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    def unit(name: Any) -> str:
        text = str(name).strip().lower()
        return _UNIT_NAMES.get(text, text)

    source, target = unit(args["from_unit"]), unit(args["to_unit"])
    convert = _CONVERSIONS.get((source, target))
    if convert is None:
        return {"error": f"cannot convert {source} to {target}; known: km, mi, kg, lb, c, f"}
    return {"value": round(convert(float(args["value"])), 4), "unit": target}


def bench_tools() -> list[Tool]:
    return [
        Tool(
            name="calculate",
            description="Evaluate an arithmetic expression: numbers, + - * / ** % and parentheses.",
            handler=_calculate,
            parameters={
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
            idempotent=True,
        ),
        Tool(
            name="lookup_price",
            description="The unit price in euros of a product from the catalogue.",
            handler=_lookup_price,
            parameters={
                "type": "object",
                "properties": {"product": {"type": "string"}},
                "required": ["product"],
                "additionalProperties": False,
            },
            idempotent=True,
        ),
        Tool(
            name="convert_units",
            description="Convert a value between units: km and mi, kg and lb, c and f.",
            handler=_convert,
            parameters={
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string"},
                    "to_unit": {"type": "string"},
                },
                "required": ["value", "from_unit", "to_unit"],
                "additionalProperties": False,
            },
            idempotent=True,
        ),
    ]


# tasks ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a task's verifier sees: the run or turns, and the agent's stored facts."""

    result: str
    tools_called: list[str]
    facts: list[str]
    started: datetime


Verifier = Callable[[Outcome], str | None]
"""``None`` when the end state is right, else what is wrong."""


def _today_forms(now: datetime) -> list[str]:
    day = now.day
    month = now.strftime("%B")
    return [
        now.strftime("%Y-%m-%d"),
        f"{month} {day}",
        f"{day} {month}",
        f"{now.strftime('%b')} {day}",
        f"{day}/{now.month}/{now.year}",
        f"{now.month}/{day}/{now.year}",
    ]


def _mentions(text: str, forms: list[str]) -> bool:
    low = text.lower()
    return any(f.lower() in low for f in forms)


def _needs(tool: str, outcome: Outcome) -> str | None:
    return None if tool in outcome.tools_called else f"{tool} was never called"


def _all(*checks: str | None) -> str | None:
    return next((c for c in checks if c), None)


def _check_demo(o: Outcome) -> str | None:
    forms = _today_forms(o.started)
    return _all(
        _needs("current_time", o),
        None if any(_mentions(f, forms) for f in o.facts) else "no stored fact holds today's date",
        None
        if _mentions(o.result, [*forms, o.started.strftime("%A")])
        else "answer lacks the date",
    )


def _contains(*needles: str) -> Verifier:
    def check(o: Outcome) -> str | None:
        missing = [n for n in needles if n.lower() not in o.result.lower()]
        return f"answer lacks {', '.join(missing)}" if missing else None

    return check


def _with_tools(*tools: str, then: Verifier) -> Verifier:
    def check(o: Outcome) -> str | None:
        return _all(*(_needs(t, o) for t in tools), then(o))

    return check


def _check_weekday(o: Outcome) -> str | None:
    day = o.started.strftime("%A")
    return _all(
        _needs("current_time", o),
        None if day.lower() in o.result.lower() else f"answer lacks {day}",
    )


def _fact_holds(*needles: str) -> Verifier:
    def check(o: Outcome) -> str | None:
        if any(all(n.lower() in f.lower() for n in needles) for f in o.facts):
            return None
        return f"no stored fact holds {' and '.join(needles)} (facts: {o.facts[:3]})"

    return check


def _check_chat_time(o: Outcome) -> str | None:
    hour = o.started.strftime("%H")
    return _all(
        _needs("current_time", o),
        None if hour in o.result else f"reply lacks the UTC hour {hour}",
    )


@dataclass(frozen=True)
class Task:
    name: str
    mode: AgentMode
    goal: str
    verify: Verifier
    tools: tuple[str, ...]
    seed_facts: tuple[dict[str, str], ...] = ()
    max_steps: int = 8


BUILTINS = ("current_time", "memory_search", "remember_fact")

TASKS: tuple[Task, ...] = (
    Task(
        "demo",
        AgentMode.AUTONOMOUS,
        "Find out the current date and time, remember it as a fact, and finish with a "
        "one-sentence answer.",
        _check_demo,
        BUILTINS,
    ),
    Task(
        "arithmetic",
        AgentMode.AUTONOMOUS,
        "Compute (17 * 23) + 4 with the calculate tool and finish with the result.",
        _with_tools("calculate", then=_contains("395")),
        (*BUILTINS, "calculate"),
    ),
    Task(
        "price_total",
        AgentMode.AUTONOMOUS,
        "Look up the price of a gadget, compute the cost of 3 gadgets, and finish with the "
        "total price in euros.",
        _with_tools("lookup_price", then=_contains("37.5")),
        (*BUILTINS, "calculate", "lookup_price"),
    ),
    Task(
        "knowledge",
        AgentMode.AUTONOMOUS,
        "Search the knowledge base to find the city where the Veltran Observatory is "
        "located, and finish with the name of the city.",
        _with_tools("knowledge_search", then=_contains("Marrowick")),
        (*BUILTINS, "knowledge_search"),
    ),
    Task(
        "remember",
        AgentMode.AUTONOMOUS,
        "Remember as a fact that the Orion project launches on 2027-03-14, then finish by "
        "saying what you stored.",
        _fact_holds("Orion", "2027-03-14"),
        BUILTINS,
    ),
    Task(
        "recall",
        AgentMode.AUTONOMOUS,
        "What is Alice's favourite colour? Check your memory and finish with the answer.",
        _contains("teal"),
        BUILTINS,
        seed_facts=(
            {"subject": "alice favourite colour", "fact": "Alice's favourite colour is teal"},
        ),
    ),
    Task(
        "weekday",
        AgentMode.AUTONOMOUS,
        "What day of the week is it today (UTC)? Finish with the name of the day.",
        _check_weekday,
        BUILTINS,
    ),
    Task(
        "convert",
        AgentMode.AUTONOMOUS,
        "Convert 42 kilometres to miles with the convert_units tool and finish with the "
        "answer rounded to one decimal place.",
        _with_tools("convert_units", then=_contains("26.1")),
        (*BUILTINS, "convert_units"),
    ),
    Task(
        "chat_time",
        AgentMode.INTERACTIVE,
        "What time is it right now?",
        _check_chat_time,
        ("current_time", "memory_search", "remember_fact", "reply"),
    ),
    Task(
        "chat_remember",
        AgentMode.INTERACTIVE,
        "Please remember that my cat is called Tom.",
        _fact_holds("Tom"),
        ("current_time", "memory_search", "remember_fact", "reply"),
    ),
    Task(
        "chat_calc",
        AgentMode.INTERACTIVE,
        "What is 12 times 12? Use the calculator.",
        _with_tools("calculate", then=_contains("144")),
        ("current_time", "calculate", "reply"),
    ),
)


# running ----------------------------------------------------------------------------------


@dataclass
class Result:
    task: str
    variant: str
    ok: bool
    why: str | None
    steps: int
    loops: int
    seconds: float
    answer: str
    log: list[str] = field(default_factory=list)
    run_id: str | None = None


def _call_key(tool: str | None, args: dict[str, Any]) -> str:
    return f"{tool}:{json.dumps(args, sort_keys=True, ensure_ascii=False)}"


def _run_log(run: TaskRun) -> tuple[list[str], list[str], int]:
    """Tools called, one line per step, and how many steps repeated an earlier call."""
    tools: list[str] = []
    lines: list[str] = []
    seen: set[str] = set()
    loops = 0
    for step in run.steps:
        if step.action is None:
            lines.append(f"{step.step_index + 1}. finish: {(step.message or '')[:120]}")
            continue
        key = _call_key(step.action.tool, step.action.args)
        loops += key in seen
        seen.add(key)
        tools.append(step.action.tool)
        summary = step.observation.summary[:100] if step.observation else ""
        lines.append(
            f"{step.step_index + 1}. {step.action.tool}"
            f"({json.dumps(step.action.args, ensure_ascii=False)[:100]}) → {summary}"
        )
    return tools, lines, loops


def ingest_corpus(dsn: str, org: str, embed: Callable[[list[str]], Any]) -> None:
    """The fictional corpus into ``COLLECTION`` of ``org``, the way the ingestion job
    drives the writer (splitter → passages with postings → sections with vectors → publish)."""
    writer = KnowledgeWriter(dsn)
    try:
        gen = writer.begin_generation(org, COLLECTION)
        paths = sorted(p for p in CORPUS.glob("*.md") if p.name != "README.md")
        for path in paths:
            data = path.read_bytes()
            source = writer.register_source(
                org, COLLECTION, path.name, hashlib.sha256(data).hexdigest(), len(data)
            )
            writer.record_health(org, COLLECTION, path.name, "READ_OK", "")
            pieces = split_bytes(data, Format.MARKDOWN)
            sections = [p for p in pieces if isinstance(p, SplitSection)]
            passages = [p for p in pieces if isinstance(p, SplitPassage)]
            writer.write_passages(gen, source, passages)
            writer.write_sections(gen, source, sections, embed([s.summary_text for s in sections]))
        writer.mark_disappeared(gen, [p.name for p in paths])
        writer.publish(gen)
    finally:
        writer.close()


async def run_task(
    runtime: Runtime, org: str, task: Task, variant: str, operator_: Principal
) -> Result:
    name = f"{task.name}-{variant}-{uuid.uuid4().hex[:6]}"
    agent = await runtime.create_agent(
        org, name, persona=PERSONA, mode=task.mode, tools=task.tools, critic=variant == "critic"
    )
    for fact in task.seed_facts:
        seeded = await runtime.invoke_tool(org, agent.id, operator_, "remember_fact", dict(fact))
        if seeded.status is not ObservationStatus.OK:
            raise RuntimeError(f"{task.name}: seeding a fact failed: {seeded.summary}")
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    log: list[str]
    if task.mode is AgentMode.AUTONOMOUS:
        run = await runtime.run_autonomous(org, agent.id, task.goal, max_steps=task.max_steps)
        tools, log, loops = _run_log(run)
        steps = len(run.steps)
        answer = run.result or ""
        failed = None if run.status is RunStatus.COMPLETED else f"{run.status.value}: {run.reason}"
    else:
        session = await runtime.open_session(org, agent.id, operator_)
        turn: TurnResult = await runtime.run_turn(session, operator_, task.goal)
        tools = [o.tool for o in turn.observations]
        keys = [o.tool + o.summary for o in turn.observations]
        loops = len(keys) - len(set(keys))
        steps = len(turn.observations) + 1
        answer = turn.reply or ""
        log = [f"{o.tool} → {o.summary[:100]}" for o in turn.observations]
        log.append(f"reply: {answer[:160]}")
        failed = None if turn.reply else f"refused: {turn.refused}"
    seconds = time.perf_counter() - t0
    # A fact is its subject and its content ("orion project": "launch date: 2027-03-14").
    facts = [
        f"{m.subject}: {m.content}" if m.subject else m.content
        for m in await runtime.memory.facts(org_id=org, agent_id=agent.id)
        if m.kind is MemoryKind.SEMANTIC and m.recorded_at >= started
    ]
    why = failed or task.verify(Outcome(answer, tools, facts, started))
    run_id = str(run.id) if task.mode is AgentMode.AUTONOMOUS else None
    return Result(task.name, variant, why is None, why, steps, loops, seconds, answer, log, run_id)


VARIANTS = {
    "planner": "K=3 candidates, the evaluation (a choice), select",
    "first": "K=1: the planner's first idea, no evaluation",
    "scores": "K=3 candidates scored 0-10 (evaluation=scores) instead of a choice",
    "critic": "K=1, and the agent's critic on (same model, a reviewer's prompt)",
    "settings": "whatever the settings say (CORTEX_CANDIDATES, CORTEX_EVALUATION)",
}


def _variant_settings(base: Settings, variant: str) -> Settings:
    update: dict[str, Any] = {
        "planner": {"candidates": 3, "evaluation": "choice"},
        "first": {"candidates": 1},
        "scores": {"candidates": 3, "evaluation": "scores"},
        "critic": {"candidates": 1},
        "settings": {},
    }.get(variant, {"unknown": True})
    if "unknown" in update:
        raise SystemExit(f"unknown variant {variant!r} ({', '.join(VARIANTS)})")
    return base.model_copy(update=update)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(sorted(PACKAGED_MODELS))
    parser.add_argument("--model", help=f"packaged model ({names}); default: the settings'")
    parser.add_argument("--tasks", help="comma-separated task names (default: all)")
    parser.add_argument(
        "--variants",
        default="planner,first",
        help="comma-separated, side by side: "
        + "; ".join(f"{k}: {v}" for k, v in VARIANTS.items()),
    )
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--quiet", action="store_true", help="no per-step log")
    parser.add_argument(
        "--record-suite",
        type=Path,
        help="write the autonomous runs as an eval suite here (JSON, as `cortex-ray eval "
        "export` writes it): each run a case that replays its decisions",
    )


async def _main(args: argparse.Namespace) -> int:
    base = load_settings()
    update: dict[str, Any] = {"model_backend": "local", "local_model_threads": args.threads}
    if args.model:
        if args.model not in PACKAGED_MODELS:
            raise SystemExit(f"--model: unknown packaged model {args.model!r}")
        update["model_name"] = args.model
    base = base.model_copy(update=update)
    wanted = [t for t in TASKS if not args.tasks or t.name in args.tasks.split(",")]
    if not wanted:
        raise SystemExit(f"--tasks: none of {args.tasks!r}; known: {[t.name for t in TASKS]}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    parts = await open_models(base, ("chat",))
    model: ModelClient | None = parts.chat
    assert model is not None
    # One database, one embedder and one loaded model, shared by every variant's runtime.
    first = await Runtime.open(
        _variant_settings(base, variants[0]), model=model, tools=bench_tools()
    )
    runtimes = {variants[0]: first}
    for v in variants[1:]:
        runtimes[v] = await Runtime.open(
            _variant_settings(base, v),
            model=model,
            tools=bench_tools(),
            db=first.db,
            embedder=first.memory.embedder,
        )
    org = f"agent-eval-{uuid.uuid4().hex[:8]}"
    operator_ = Principal.operator(org)
    knowledge = first.knowledge
    assert knowledge is not None
    embedder = knowledge.embedder

    def embed(texts: list[str]) -> Any:
        return asyncio.run_coroutine_threadsafe(embedder.embed(texts), loop).result()

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(ingest_corpus, first.db.dsn, org, embed)
    print(
        f"agent_eval tasks: model {base.models.name}, K={base.decide.candidates}, "
        f"{len(wanted)} tasks × {variants}, org {org}",
        file=sys.stderr,
    )
    results: list[Result] = []
    cases: list[EvalCase] = []
    try:
        for task in wanted:
            for variant in variants:  # interleaved, so drift in machine load hits both
                result = await run_task(runtimes[variant], org, task, variant, operator_)
                results.append(result)
                mark = "PASS" if result.ok else "FAIL"
                print(
                    f"{mark} {task.name:<14} {variant:<8} steps {result.steps:>2} "
                    f"loops {result.loops} {result.seconds:6.1f}s  {result.why or ''}",
                    file=sys.stderr,
                )
                if not args.quiet:
                    for line in result.log:
                        print(f"      {line}", file=sys.stderr)
                if args.record_suite and result.run_id is not None:
                    cases.append(await _case(runtimes[variant], org, result))
        if args.record_suite:
            _write_suite(args.record_suite, base, cases)
    finally:
        for runtime in reversed(list(runtimes.values())):
            await runtime.close()
        await model.aclose()
    _report(results, variants, base)
    if args.json:
        args.json.write_text(
            json.dumps([r.__dict__ for r in results], indent=2, ensure_ascii=False)
        )
    return 0


async def _case(runtime: Runtime, org: str, result: Result) -> EvalCase:
    """The run as a regression case: its recorded status, every decision as recorded."""
    assert result.run_id is not None
    verdict = "passed" if result.ok else f"failed ({result.why})"
    return await runtime.eval_case_from_run(
        org,
        uuid.UUID(result.run_id),
        name=f"{result.task}-{result.variant}",
        description=f"agent_eval task {result.task!r}, variant {result.variant}; "
        f"its verifier {verdict}"[:500],
    )


def _write_suite(path: Path, settings: Settings, cases: list[EvalCase]) -> None:
    suite = EvalSuite(
        name=path.stem,
        description=f"agent_eval tasks recorded with {settings.models.name}",
        cases=tuple(cases),
    )
    body = suite.model_dump(mode="json", include={"name", "description", "cases"})
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(cases)} cases", file=sys.stderr)


def _report(results: list[Result], variants: list[str], settings: Settings) -> None:
    print(f"\nmodel {settings.models.name}, {os.cpu_count()} cores")
    print("| variant | completed | autonomous | interactive | mean steps | loops | s/step |")
    print("|---|---|---|---|---|---|---|")
    done: dict[str, int] = {}
    for v in variants:
        rows = [r for r in results if r.variant == v]
        auto = [r for r in rows if not r.task.startswith("chat_")]
        chat = [r for r in rows if r.task.startswith("chat_")]
        done[v] = sum(r.ok for r in rows)
        steps = sum(r.steps for r in rows)
        per_step = sum(r.seconds for r in rows) / max(1, steps)
        print(
            f"| {v} | {done[v]}/{len(rows)} ({100 * done[v] / max(1, len(rows)):.0f}%) "
            f"| {sum(r.ok for r in auto)}/{len(auto)} | {sum(r.ok for r in chat)}/{len(chat)} "
            f"| {statistics.mean(r.steps for r in rows):.1f} | {sum(r.loops for r in rows)} "
            f"| {per_step:.1f} |"
        )
    for other in (v for v in variants if v != "planner"):
        if "planner" in done:
            ratio = done["planner"] / done[other] if done[other] else math.inf
            print(f"completed planner/{other}: {ratio:.2f}×")


def main(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))
