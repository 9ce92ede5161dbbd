"""Agent benchmark (issue 14, point 2): does the planner decide better than one plain call?

``single``: a fixed, seeded sample of BFCL's non-live single-turn cases (``simple_python``,
``multiple``, ``parallel``, ``parallel_multiple``; the ``live_*`` categories are held out and
never read), each run twice, side by side, in one process with one loaded model:

OURS      the real autonomous planner, ``AutonomousDriver(model, PromptComposer(),
          settings).decide(wm)``: PROPOSE K candidates → EVALUATE (skipped with one valid
          candidate) → SELECT the argmax. ``wm`` is a ``WorkingMemory`` in AUTONOMOUS mode:
          objective = the user's question, action space = the case's functions as
          ``ToolSpec``s, an empty ``MemorySnapshot``, the step budget of the settings
          (``default_max_steps``; not the number of expected calls, which would give the
          answer away). simple/multiple: one decision. parallel: one action per step; each
          selected call comes back as an ``Observation`` (status OK, summary "done",
          step_index increasing) and the planner decides again, until it finishes or has taken
          (expected calls + 1) steps; the calls it made are its answer.
BASELINE  the same model, ONE call with the same tool schemas:
          simple/multiple: a ``ChatRequest`` with ``tools=`` (OpenAI function definitions)
          and the question as the only message. The llama.cpp backend decodes such a request
          under a grammar admitting ``{"reply": ...}`` or one call of one of the tools with
          its own argument schema, and puts a tool list in a system message
          (cortex_ray.models.llama_cpp); a reply is "no call".
          parallel: that tools path returns one call only, so the baseline is one
          ``response_schema``-constrained call ``{"calls": [anyOf {"tool": const name,
          "arguments": that tool's schema}], minItems 1}``, with a system message listing
          the tools and asking for every call the request needs (no retry, as the tools
          call has none). No maxItems: llama.cpp unrolls it into nested optional rules, and
          with maxItems 8 one call took minutes; an answer that runs to the token limit
          (SmolLM2 repeats calls) is a failed answer.

Scoring: BFCL's AST checker rules, re-implemented in ``_bfcl.py`` (its docstring lists them).
BFCL names with dots (``math.factorial``) are tool names with ``_`` here, mapped back before
checking; BFCL's parameter types become JSON schema (dict→object, float→number,
tuple→array, any→no type), objects closed with ``additionalProperties: false`` on both sides.

Reported per category and side: right function %, fully right %, no call/failed %, mean
seconds per case, and OURS/BASELINE of fully-right accuracy. For OURS also why it wins or
loses, over its decisions: how often a right call was among the proposals, the first
proposal was right, the selected one was right, a right one was proposed but another
selected, and the selection was the first proposal.

Run: ``.venv/bin/python bench/agent_eval.py single [--model NAME] [--n 15] [--seed 0]
[--categories simple_python,multiple,parallel] [--json OUT]``.

``tasks``: the whole-task suite (``bench/_tasks.py``, when it exists).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Benchmark the working tree this file sits in; bench/ itself for the helper modules.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _multiturn as mt
from _bfcl import (
    CATEGORIES,
    Call,
    Case,
    ToolNames,
    Verdict,
    bfcl_data_dir,
    check_call,
    check_case,
    load_cases,
    sample_cases,
    to_json_schema,
)
from pydantic import BaseModel, ConfigDict, Field

from cortex_ray import Settings
from cortex_ray._exceptions import ModelError
from cortex_ray._types import (
    ActionType,
    AgentMode,
    Decision,
    DecisionKind,
    MemorySnapshot,
    Observation,
    ObservationStatus,
    ToolSpec,
    WorkingMemory,
)
from cortex_ray.decide import AutonomousDriver
from cortex_ray.models import ChatMessage, ChatRequest, ChatResponse, ModelClient, open_models
from cortex_ray.perceive import PromptComposer, ToolRetriever, WorkingMemoryAssembler, always_shown

PARALLEL = ("parallel", "parallel_multiple")
AGENT_NAME = "assistant"
OBSERVATION_SUMMARY = "done"
MULTI_RESULT_CHARS = 500  # a tool result as the next step sees it


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepLog(_Model):
    """One planner decision and how its candidates fared against the possible answer."""

    candidates: int = Field(description="valid candidates proposed")
    distinct: int = Field(description="valid candidates that differ from each other")
    right_proposed: bool
    first_right: bool
    selected_right: bool
    selected_first: bool
    scored: bool = Field(description="the valid candidates' scores differ")
    scores: list[float | None] = Field(default_factory=list)
    reason: str = ""


class Work(_Model):
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cut_at_limit: int = 0


class SideResult(_Model):
    calls: list[Call]
    verdict: Verdict
    no_call: bool
    seconds: float
    work: Work = Work()
    detail: str = ""


class CaseResult(_Model):
    id: str
    category: str
    ours: SideResult
    baseline: SideResult
    steps: list[StepLog]


# --- the two sides ------------------------------------------------------------------------


class CountingModel:
    """The loaded model, counting what one side asks of it (calls, tokens, outputs cut at
    the token limit), so that a side's time can be read against its work."""

    def __init__(self, model: ModelClient, label: str = "", *, verbose: bool = False) -> None:
        self.model = model
        self.label = label
        self.verbose = verbose
        self.reset()

    def reset(self) -> None:
        self.calls = self.prompt_tokens = self.completion_tokens = self.cut = 0

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def supports_json_schema(self) -> bool:
        return self.model.supports_json_schema

    async def chat(self, request: ChatRequest) -> ChatResponse:
        start = time.perf_counter()
        response = await self.model.chat(request)
        if self.verbose:
            kind = "tools" if request.tools else request.schema_name
            print(
                f"    {self.label} {kind}: {time.perf_counter() - start:.1f} s, "
                f"{response.usage.prompt_tokens} prompt + {response.usage.completion_tokens} "
                f"output tokens, {response.finish_reason}",
                file=sys.stderr,
                flush=True,
            )
        self.calls += 1
        self.prompt_tokens += response.usage.prompt_tokens
        self.completion_tokens += response.usage.completion_tokens
        self.cut += response.finish_reason == "length"
        return response

    async def aclose(self) -> None:
        await self.model.aclose()

    def work(self) -> Work:
        return Work(
            model_calls=self.calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cut_at_limit=self.cut,
        )


def tool_specs(case: Case, names: ToolNames) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            name=names.tool(f["name"]),
            description=str(f.get("description", "")),
            parameters=to_json_schema(f.get("parameters") or {"type": "dict", "properties": {}}),
            action_type=ActionType.GROUNDING,
        )
        for f in case.functions
    )


def openai_tools(specs: Sequence[ToolSpec]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.parameters},
        }
        for s in specs
    )


def _remaining(case: Case, calls: Sequence[Call]) -> list[dict[str, dict[str, Any]]]:
    """The expected calls not yet matched by ``calls`` (greedy, in order)."""
    left = list(case.answers)
    for call in calls:
        for i, answer in enumerate(left):
            if not check_call(_doc(case, answer), call, answer):
                del left[i]
                break
    return left


def _doc(case: Case, answer: dict[str, Any]) -> dict[str, Any]:
    name = next(iter(answer))
    return next((f for f in case.functions if f["name"] == name), {})


def _step_log(case: Case, names: ToolNames, made: list[Call], decision: Decision) -> StepLog:
    left = _remaining(case, made)

    def right(kind: str, tool: str | None, args: dict[str, Any]) -> bool:
        if kind == "finish":
            return not left
        call = Call(name=names.bfcl(tool or ""), args=args)
        return any(not check_call(_doc(case, a), call, a) for a in left)

    valid = [c for c in decision.candidates if c.valid]
    marks = [right(c.kind, c.tool, c.args) for c in valid]
    keys = {json.dumps([c.kind, c.tool, c.args, c.message], sort_keys=True) for c in valid}
    chosen = next((c for c in valid if c.index == decision.selected), None)
    return StepLog(
        candidates=len(valid),
        distinct=len(keys),
        right_proposed=any(marks),
        first_right=bool(marks) and marks[0],
        selected_right=chosen is not None and right(chosen.kind, chosen.tool, chosen.args),
        selected_first=chosen is not None and chosen is valid[0],
        scored=len({c.score for c in valid}) > 1,
        scores=[c.score for c in valid],
        reason=decision.reason,
    )


def _call_args(args: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as the observation carries them, where ``Observation`` has the
    field (what the planner is told it already did)."""
    return {"args": args} if "args" in Observation.model_fields else {}


async def shown_tools(
    retriever: ToolRetriever | None,
    specs: tuple[ToolSpec, ...],
    question: str,
    observations: Sequence[Observation] = (),
) -> tuple[tuple[ToolSpec, ...], tuple[ToolSpec, ...]]:
    """``(shown, hidden)``: as PERCEIVE chooses them (``--tool-retrieval``), else all shown."""
    if retriever is None:
        return specs, ()
    query = WorkingMemoryAssembler.recall_query(question, observations, ())
    return await retriever.shown(specs, query, always_shown(AgentMode.AUTONOMOUS, observations, ()))


async def run_ours(
    driver: AutonomousDriver,
    counter: CountingModel,
    settings: Settings,
    case: Case,
    names: ToolNames,
    retriever: ToolRetriever | None = None,
) -> tuple[SideResult, list[StepLog]]:
    specs = tool_specs(case, names)
    budget = len(case.answers) + 1 if case.category in PARALLEL else 1
    calls: list[Call] = []
    observations: list[Observation] = []
    steps: list[StepLog] = []
    detail = ""
    counter.reset()
    start = time.perf_counter()
    for step in range(budget):
        shown, hidden = await shown_tools(retriever, specs, case.question, observations)
        wm = WorkingMemory(
            mode=AgentMode.AUTONOMOUS,
            agent_name=AGENT_NAME,
            persona="",
            objective=case.question,
            snapshot=MemorySnapshot(query=case.question),
            action_space=shown,
            hidden_tools=hidden,
            observations=tuple(observations),
            step_index=step,
            max_steps=settings.decide.default_max_steps,
        )
        decision = await driver.decide(wm)
        steps.append(_step_log(case, names, calls, decision))
        if decision.kind is not DecisionKind.ACT or decision.action is None:
            detail = decision.reason if decision.failed else f"finished: {decision.message}"
            break
        action = decision.action
        calls.append(Call(name=names.bfcl(action.tool), args=action.args))
        observations.append(
            Observation(
                tool=action.tool,
                action_type=action.action_type,
                status=ObservationStatus.OK,
                summary=OBSERVATION_SUMMARY,
                step_index=step,
                **_call_args(action.args),
            )
        )
    seconds = time.perf_counter() - start
    return (
        SideResult(
            calls=calls,
            verdict=check_case(case, calls),
            no_call=not calls,
            seconds=seconds,
            work=counter.work(),
            detail=detail[:300],
        ),
        steps,
    )


def calls_schema(specs: Sequence[ToolSpec]) -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "properties": {"tool": {"const": s.name}, "arguments": s.parameters},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for s in specs
    ]
    return {
        "type": "object",
        "properties": {"calls": {"type": "array", "items": {"anyOf": options}, "minItems": 1}},
        "required": ["calls"],
        "additionalProperties": False,
    }


def calls_prompt(specs: Sequence[ToolSpec]) -> str:
    lines = [
        'Answer {"calls": [{"tool": name, "arguments": {...}}, ...]} with every function call '
        "the request needs. Tools:"
    ]
    for s in specs:
        params = json.dumps(s.parameters.get("properties", {}), separators=(",", ":"))
        lines.append(f"- {s.name}: {s.description} arguments: {params}")
    return "\n".join(lines)


async def run_baseline(
    model: CountingModel, case: Case, names: ToolNames, retriever: ToolRetriever | None = None
) -> SideResult:
    specs, _ = await shown_tools(retriever, tool_specs(case, names), case.question)
    user = ChatMessage(role="user", content=case.question)
    calls: list[Call] = []
    detail = ""
    model.reset()
    start = time.perf_counter()
    try:
        if case.category in PARALLEL:
            system = ChatMessage(role="system", content=calls_prompt(specs))
            response = await model.chat(
                ChatRequest(
                    messages=(system, user),
                    response_schema=calls_schema(specs),
                    schema_name="calls",
                )
            )
            parsed = json.loads(response.content or "", strict=False)
            for item in parsed.get("calls", []):
                calls.append(Call(name=names.bfcl(item["tool"]), args=item.get("arguments", {})))
        else:
            response = await model.chat(ChatRequest(messages=(user,), tools=openai_tools(specs)))
            if not response.tool_calls:
                detail = f"replied: {response.content}"
            for tc in response.tool_calls[:1]:
                args = json.loads(tc.arguments or "{}", strict=False)
                calls.append(Call(name=names.bfcl(tc.name), args=args))
    except (ModelError, ValueError, KeyError, TypeError, AttributeError) as exc:
        calls, detail = [], f"failed: {type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    return SideResult(
        calls=calls,
        verdict=check_case(case, calls),
        no_call=not calls,
        seconds=seconds,
        work=model.work(),
        detail=detail[:300],
    )


# --- the report ---------------------------------------------------------------------------


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def summarise(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Per category (and "all"): each side's rates, the ratio and the planner's diagnostics."""
    by: dict[str, list[CaseResult]] = {}
    for r in results:
        by.setdefault(r.category, []).append(r)
    if len(by) > 1:
        by["all"] = list(results)
    out: dict[str, Any] = {}
    for category, rs in by.items():
        n = len(rs)
        row: dict[str, Any] = {"cases": n}
        for side in ("ours", "baseline"):
            sides = [getattr(r, side) for r in rs]
            row[side] = {
                "right_function_pct": _pct(sum(s.verdict.right_function for s in sides), n),
                "fully_right_pct": _pct(sum(s.verdict.correct for s in sides), n),
                "no_call_pct": _pct(sum(s.no_call for s in sides), n),
                "mean_s": statistics.fmean(s.seconds for s in sides) if sides else 0.0,
                "median_s": statistics.median(s.seconds for s in sides) if sides else 0.0,
                "model_calls_per_case": statistics.fmean(s.work.model_calls for s in sides),
                "completion_tokens_per_case": statistics.fmean(
                    s.work.completion_tokens for s in sides
                ),
                "cut_at_limit": sum(s.work.cut_at_limit for s in sides),
            }
        base = row["baseline"]["fully_right_pct"]
        row["ratio_fully_right"] = row["ours"]["fully_right_pct"] / base if base else None
        steps = [s for r in rs for s in r.steps]
        m = len(steps)
        row["planner"] = {
            "decisions": m,
            "right_proposed_pct": _pct(sum(s.right_proposed for s in steps), m),
            "first_right_pct": _pct(sum(s.first_right for s in steps), m),
            "selected_right_pct": _pct(sum(s.selected_right for s in steps), m),
            "right_proposed_not_selected": sum(
                s.right_proposed and not s.selected_right for s in steps
            ),
            "selected_first_pct": _pct(sum(s.selected_first for s in steps), m),
            "scored_pct": _pct(sum(s.scored for s in steps), m),
            "mean_valid_candidates": statistics.fmean(s.candidates for s in steps) if m else 0.0,
            "mean_distinct_candidates": statistics.fmean(s.distinct for s in steps) if m else 0.0,
        }
        out[category] = row
    return out


def render(summary: dict[str, Any]) -> str:
    lines = [
        "| category | cases | side | right function | fully right | no call/failed | "
        "s/case (mean, median) | "
        "model calls/case | output tokens/case | cut at limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for category, row in summary.items():
        for side in ("ours", "baseline"):
            s = row[side]
            lines.append(
                f"| {category} | {row['cases']} | {side} | {s['right_function_pct']:.0f}% | "
                f"{s['fully_right_pct']:.0f}% | {s['no_call_pct']:.0f}% | "
                f"{s['mean_s']:.1f}, {s['median_s']:.1f} | "
                f"{s['model_calls_per_case']:.1f} | {s['completion_tokens_per_case']:.0f} | "
                f"{s['cut_at_limit']} |"
            )
    lines += [
        "",
        "| category | ours/baseline (fully right) | decisions | right proposed | first right | "
        "selected right | right proposed, other selected | selected = first | scores differ | "
        "valid / distinct candidates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for category, row in summary.items():
        p = row["planner"]
        ratio = "n/a" if row["ratio_fully_right"] is None else f"{row['ratio_fully_right']:.2f}"
        lines.append(
            f"| {category} | {ratio} | {p['decisions']} | {p['right_proposed_pct']:.0f}% | "
            f"{p['first_right_pct']:.0f}% | {p['selected_right_pct']:.0f}% | "
            f"{p['right_proposed_not_selected']} | {p['selected_first_pct']:.0f}% | "
            f"{p['scored_pct']:.0f}% | {p['mean_valid_candidates']:.1f} / "
            f"{p['mean_distinct_candidates']:.1f} |"
        )
    return "\n".join(lines)


# --- the subcommands ----------------------------------------------------------------------


def _categories(text: str) -> list[str]:
    found = [c.strip() for c in text.split(",") if c.strip()]
    for c in found:
        if c not in CATEGORIES:
            raise argparse.ArgumentTypeError(f"{c!r}: not one of {', '.join(CATEGORIES)}")
    return found


def planner_version() -> str:
    """The commit, and a hash of the planner's and the composer's source as they are now
    (the working tree may hold changes that are not committed yet)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for folder in ("decide", "perceive"):
        for path in sorted((root / "cortex_ray" / folder).glob("*.py")):
            digest.update(path.read_bytes())
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        head = ""
    return f"{head or 'unknown'}+planner:{digest.hexdigest()[:12]}"


def _settings(args: argparse.Namespace, **more: Any) -> Settings:
    overrides: dict[str, Any] = {"model_backend": "local", "local_model_threads": args.threads}
    if args.model:
        overrides["model_name"] = args.model
    if args.candidates:
        overrides["candidates"] = args.candidates
    if args.max_tokens:
        overrides["model_max_tokens"] = args.max_tokens
    for item in args.setting or ():
        key, _, value = item.partition("=")
        overrides[key.strip()] = value.strip()
    return Settings(**overrides, **more)


async def _open(
    settings: Settings, *, verbose: bool = False
) -> tuple[ModelClient, AutonomousDriver, CountingModel, CountingModel]:
    """The model, loaded once; the planner and the baseline each count their own use of it."""
    start = time.perf_counter()
    parts = await open_models(settings, ("chat",))
    assert parts.chat is not None
    model = parts.chat
    print(f"loaded {model.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    ours_model = CountingModel(model, "ours", verbose=verbose)
    base_model = CountingModel(model, "baseline", verbose=verbose)
    driver = AutonomousDriver(
        ours_model,
        PromptComposer(),
        settings.decide,
        structured_retries=settings.models.structured_retries,
    )
    return model, driver, ours_model, base_model


def with_distractors(cases: Sequence[Case], data: Path, n: int, seed: int) -> list[Case]:
    """Each case with ``n`` functions of other BFCL cases (every non-live category; one
    documentation per name, none sharing a name with the case's own) added to its tools,
    drawn with a generator seeded by ``seed`` and the case id: an agent holding hundreds of
    tools, among which the case's few are the right ones."""
    pool: dict[str, dict[str, Any]] = {}
    for category in CATEGORIES:
        for other in load_cases(data, category):
            for function in other.functions:
                pool.setdefault(function["name"], function)
    names = sorted(pool)
    out = []
    for case in cases:
        own = {f["name"] for f in case.functions}
        rng = random.Random(f"{seed}:{case.id}:distractors")
        extra = rng.sample([name for name in names if name not in own], n)
        functions = case.functions + tuple(pool[name] for name in extra)
        out.append(case.model_copy(update={"functions": functions}))
    return out


async def single(args: argparse.Namespace) -> int:
    data = args.bfcl_data or bfcl_data_dir()
    if data is None or not (data / "possible_answer").is_dir():
        print(
            "no BFCL data: pip install --no-deps bfcl-eval==2026.3.23, or pass --bfcl-data DIR",
            file=sys.stderr,
        )
        return 2
    settings = _settings(args)
    if args.ids:
        wanted = set(args.ids.split(","))
        cases = [c for cat in args.categories for c in load_cases(data, cat) if c.id in wanted]
    else:
        cases = [
            case
            for category in args.categories
            for case in sample_cases(load_cases(data, category), args.n, args.seed)
        ]
    if args.distractors:
        cases = with_distractors(cases, data, args.distractors, args.seed)
    retriever = None
    if args.tool_retrieval:
        from cortex_ray.models import SentenceTransformerEmbedder

        retriever = ToolRetriever(
            SentenceTransformerEmbedder(),
            settings.knowledge,
            threshold=settings.decide.tool_retrieval_threshold,
            k=settings.decide.tool_retrieval_k,
        )
    print(
        f"tools per case: the case's own + {args.distractors} distractors; tool retrieval "
        + (
            f"on (threshold {settings.decide.tool_retrieval_threshold}, "
            f"k {settings.decide.tool_retrieval_k}"
            f", fusion {settings.knowledge.fusion.value}; both sides get the tools shown)"
            if retriever
            else "off (both sides get every tool)"
        ),
        file=sys.stderr,
    )
    print(
        f"model {settings.models.name}, K={settings.decide.candidates}, evaluation "
        f"{settings.decide.evaluation}, {len(cases)} cases "
        f"({', '.join(args.categories)}; n={args.n}, seed={args.seed}), "
        f"{args.threads} threads",
        file=sys.stderr,
    )
    version = planner_version()
    print(f"planner {version}", file=sys.stderr)
    model, driver, ours_model, base_model = await _open(settings, verbose=args.verbose)
    results: list[CaseResult] = []
    try:
        for i, case in enumerate(cases):
            names = ToolNames([f["name"] for f in case.functions])
            # alternate which side goes first, so that drift on a busy machine cancels
            if i % 2 == 0:
                ours, steps = await run_ours(driver, ours_model, settings, case, names, retriever)
                baseline = await run_baseline(base_model, case, names, retriever)
            else:
                baseline = await run_baseline(base_model, case, names, retriever)
                ours, steps = await run_ours(driver, ours_model, settings, case, names, retriever)
            results.append(
                CaseResult(
                    id=case.id, category=case.category, ours=ours, baseline=baseline, steps=steps
                )
            )
            print(
                f"[{i + 1}/{len(cases)}] {case.id}: ours {'ok' if ours.verdict.correct else 'x'}"
                f" ({ours.seconds:.1f} s), baseline {'ok' if baseline.verdict.correct else 'x'}"
                f" ({baseline.seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await model.aclose()
    summary = summarise(results)
    print(render(summary))
    if args.json:
        report = {
            "model": settings.models.name,
            "planner": version,
            "candidates": settings.decide.candidates,
            "evaluation": settings.decide.evaluation,
            "n": args.n,
            "seed": args.seed,
            "categories": args.categories,
            "threads": args.threads,
            "max_tokens": settings.models.max_tokens,
            "distractors": args.distractors,
            "tool_retrieval": bool(args.tool_retrieval),
            "summary": summary,
            "cases": [r.model_dump(mode="json") for r in results],
        }
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


# --- multiturn -----------------------------------------------------------------------------


class TurnLog(_Model):
    calls: list[Call]
    state_error: str = ""
    missing_results: int = 0
    right: bool


class MultiSide(_Model):
    turns: list[TurnLog]
    right: bool
    turns_right: int = Field(description="turns right before the first wrong one")
    seconds: float
    work: Work = Work()


class MultiCaseResult(_Model):
    id: str
    classes: list[str]
    expected_calls: int
    ours: MultiSide
    baseline: MultiSide


def _objective(case: mt.MultiTurnCase, turn: int) -> str:
    if turn == 0:
        return case.turns[0]
    earlier = "\n".join(f"- {t}" for t in case.turns[:turn])
    return f"{case.turns[turn]}\n\nEarlier requests (already handled):\n{earlier}"


def _turn_log(
    env: mt.ToolEnv, gt: mt.ToolEnv, expected: list[str], made: list[str], calls: list[Call]
) -> TurnLog:
    state = env.state_difference(gt)
    missing = mt.responses_missing(expected, made)
    return TurnLog(
        calls=calls,
        state_error=state,
        missing_results=len(missing),
        right=not state and not missing,
    )


def _side(turns: list[TurnLog], seconds: float, work: Work) -> MultiSide:
    right_until = next((i for i, t in enumerate(turns) if not t.right), len(turns))
    return MultiSide(
        turns=turns,
        right=right_until == len(turns),
        turns_right=right_until,
        seconds=seconds,
        work=work,
    )


async def multi_ours(
    driver: AutonomousDriver,
    counter: CountingModel,
    settings: Settings,
    case: mt.MultiTurnCase,
    docs: list[dict[str, Any]],
) -> MultiSide:
    names = ToolNames([d["name"] for d in docs])
    specs = tuple(
        ToolSpec(
            name=names.tool(d["name"]),
            description=str(d.get("description", "")),
            parameters=to_json_schema(d.get("parameters") or {"type": "dict", "properties": {}}),
        )
        for d in docs
    )
    env, gt = mt.ToolEnv(case), mt.ToolEnv(case)
    observations: list[Observation] = []
    results: list[str] = []
    turns: list[TurnLog] = []
    counter.reset()
    start = time.perf_counter()
    for turn, expected_src in enumerate(case.answers):
        expected = [gt.run_source(src) for src in expected_src]
        calls: list[Call] = []
        for _ in range(len(expected_src) + 2):
            wm = WorkingMemory(
                mode=AgentMode.AUTONOMOUS,
                agent_name=AGENT_NAME,
                persona="",
                objective=_objective(case, turn),
                snapshot=MemorySnapshot(query=case.turns[turn]),
                action_space=specs,
                observations=tuple(observations),
                step_index=len(observations),
                max_steps=settings.decide.default_max_steps,
            )
            decision = await driver.decide(wm)
            if decision.kind is not DecisionKind.ACT or decision.action is None:
                break
            action = decision.action
            call = Call(name=names.bfcl(action.tool), args=action.args)
            result = env.call(call.name, call.args)
            calls.append(call)
            results.append(result)
            failed = result.startswith(mt.ERROR_PREFIX)
            observations.append(
                Observation(
                    tool=action.tool,
                    action_type=action.action_type,
                    status=ObservationStatus.ERROR if failed else ObservationStatus.OK,
                    summary=result[:MULTI_RESULT_CHARS],
                    step_index=len(observations),
                    **_call_args(action.args),
                )
            )
        turns.append(_turn_log(env, gt, expected, results, calls))
    return _side(turns, time.perf_counter() - start, counter.work())


async def multi_baseline(
    model: CountingModel, case: mt.MultiTurnCase, docs: list[dict[str, Any]]
) -> MultiSide:
    names = ToolNames([d["name"] for d in docs])
    tools = tuple(
        {
            "type": "function",
            "function": {
                "name": names.tool(d["name"]),
                "description": str(d.get("description", "")),
                "parameters": to_json_schema(d.get("parameters") or {"type": "dict"}),
            },
        }
        for d in docs
    )
    env, gt = mt.ToolEnv(case), mt.ToolEnv(case)
    messages: list[ChatMessage] = []
    results: list[str] = []
    turns: list[TurnLog] = []
    model.reset()
    start = time.perf_counter()
    for turn, expected_src in enumerate(case.answers):
        expected = [gt.run_source(src) for src in expected_src]
        messages.append(ChatMessage(role="user", content=case.turns[turn]))
        calls: list[Call] = []
        for _ in range(len(expected_src) + 2):
            try:
                response = await model.chat(ChatRequest(messages=tuple(messages), tools=tools))
            except ModelError:
                break
            if not response.tool_calls:
                messages.append(ChatMessage(role="assistant", content=response.content or ""))
                break
            tc = response.tool_calls[0]
            try:
                args = json.loads(tc.arguments or "{}", strict=False)
            except ValueError:
                args = {}
            call = Call(name=names.bfcl(tc.name), args=args if isinstance(args, dict) else {})
            result = env.call(call.name, call.args)
            calls.append(call)
            results.append(result)
            messages.append(ChatMessage(role="assistant", tool_calls=(tc,)))
            messages.append(
                ChatMessage(role="tool", content=result[:MULTI_RESULT_CHARS], tool_call_id=tc.id)
            )
        turns.append(_turn_log(env, gt, expected, results, calls))
    return _side(turns, time.perf_counter() - start, model.work())


def render_multi(results: Sequence[MultiCaseResult]) -> str:
    lines = [
        "| side | cases | all turns right | turns right (before the first wrong) | "
        "model calls/case | s/case |",
        "|---|---|---|---|---|---|",
    ]
    n = len(results)
    total_turns = sum(len(r.ours.turns) for r in results)
    for side in ("ours", "baseline"):
        sides = [getattr(r, side) for r in results]
        lines.append(
            f"| {side} | {n} | {_pct(sum(s.right for s in sides), n):.0f}% | "
            f"{sum(s.turns_right for s in sides)}/{total_turns} | "
            f"{statistics.fmean(s.work.model_calls for s in sides) if n else 0:.1f} | "
            f"{statistics.fmean(s.seconds for s in sides) if n else 0:.0f} |"
        )
    return "\n".join(lines)


async def multiturn(args: argparse.Namespace) -> int:
    data = args.bfcl_data or bfcl_data_dir()
    if data is None or not (data / "multi_turn_func_doc").is_dir():
        print("no BFCL data: pip install --no-deps bfcl-eval==2026.3.23", file=sys.stderr)
        return 2
    settings = _settings(args, local_model_context=args.context)
    cases = sample_multi(mt.load_multi_turn(data), args.n, args.seed)
    try:
        for case in cases:
            mt.ToolEnv(case)
    except ImportError as exc:
        print(f"BFCL's tool classes do not import here ({exc}): skipped", file=sys.stderr)
        return 2
    version = planner_version()
    print(f"planner {version}", file=sys.stderr)
    model, driver, ours_model, base_model = await _open(settings, verbose=args.verbose)
    print(f"{len(cases)} multi_turn_base cases (n={args.n}, seed={args.seed})", file=sys.stderr)
    results: list[MultiCaseResult] = []
    try:
        for i, case in enumerate(cases):
            docs = mt.func_docs(data, case)
            ours = await multi_ours(driver, ours_model, settings, case, docs)
            baseline = await multi_baseline(base_model, case, docs)
            results.append(
                MultiCaseResult(
                    id=case.id,
                    classes=list(case.classes),
                    expected_calls=sum(len(t) for t in case.answers),
                    ours=ours,
                    baseline=baseline,
                )
            )
            print(
                f"[{i + 1}/{len(cases)}] {case.id}: ours {ours.turns_right}/{len(ours.turns)} "
                f"turns ({ours.seconds:.0f} s), baseline {baseline.turns_right}/"
                f"{len(baseline.turns)} ({baseline.seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await model.aclose()
    print(render_multi(results))
    if args.json:
        report = {
            "model": settings.models.name,
            "planner": version,
            "candidates": settings.decide.candidates,
            "evaluation": settings.decide.evaluation,
            "n": args.n,
            "seed": args.seed,
            "cases": [r.model_dump(mode="json") for r in results],
        }
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    return 0


def sample_multi(cases: Sequence[mt.MultiTurnCase], n: int, seed: int) -> list[mt.MultiTurnCase]:
    if n >= len(cases):
        return list(cases)
    rng = random.Random(f"{seed}:multi_turn_base")
    picked = set(rng.sample(range(len(cases)), n))
    return [c for i, c in enumerate(cases) if i in picked]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("single", help="BFCL single decisions: the planner vs one plain call")
    m = sub.add_parser("multiturn", help="BFCL multi_turn_base: the planner vs a plain tool loop")
    for p in (s, m):
        p.add_argument("--model", default=None, help="a packaged model (default: the settings')")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--candidates", type=int, default=None, help="K (default: the settings')")
        p.add_argument(
            "--max-tokens",
            type=int,
            default=None,
            help="completion tokens (default: the settings')",
        )
        p.add_argument("--bfcl-data", type=Path, default=None, help="BFCL's data folder")
        p.add_argument("--json", type=Path, default=None, help="write the results here")
        p.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
        p.add_argument("--verbose", action="store_true", help="print every model call's cost")
        p.add_argument(
            "--setting",
            action="append",
            metavar="KEY=VALUE",
            help="any other Settings field, e.g. evaluation=scores (repeatable)",
        )
    s.add_argument("--n", type=int, default=15, help="cases per category")
    s.add_argument("--ids", default=None, help="only these case ids (comma-separated), no sample")
    s.add_argument(
        "--distractors",
        type=int,
        default=0,
        help="add N other BFCL functions to each case's tools (a large action space)",
    )
    s.add_argument(
        "--tool-retrieval",
        action="store_true",
        help="show both sides only the tools PERCEIVE's tool retrieval would show",
    )
    m.add_argument("--n", type=int, default=3, help="cases")
    m.add_argument("--context", type=int, default=8192, help="the model's context (tokens)")
    s.add_argument(
        "--categories",
        type=_categories,
        default=["simple_python", "multiple", "parallel"],
        help=f"comma-separated, from {', '.join(CATEGORIES)}",
    )
    t = sub.add_parser("tasks", help="the whole-task suite (bench/_tasks.py)")
    try:
        import _tasks  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        t.set_defaults(tasks_missing=str(exc))
    else:
        _tasks.add_arguments(t)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "single":
        return asyncio.run(single(args))
    if args.command == "multiturn":
        return asyncio.run(multiturn(args))
    if getattr(args, "tasks_missing", None):
        print(f"the tasks suite is not available: {args.tasks_missing}", file=sys.stderr)
        return 2
    import _tasks  # type: ignore[import-not-found, unused-ignore]

    result: int = _tasks.main(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
