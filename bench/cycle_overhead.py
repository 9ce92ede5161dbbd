"""Cycle overhead (issues 2, 12): what one autonomous step costs beyond the database work it does.

OURS      ``Runtime.run_autonomous(max_steps=N)`` with a zero-latency model and embedder:
          every step is PERCEIVE (one memory read), DECIDE (propose; one candidate, so the
          evaluate call is skipped), ACT (a trivial bench tool, ``tick(n)``: the clock and
          the step's number, a new argument each step so that no call repeats, through the
          invocation gate) and LEARN (one transaction: ledger + audit + memory rows, the
          three statements pipelined, so BEGIN, one round trip, COMMIT); the last
          step is a finish. Per-run bookkeeping (load the agent, create the run, record its end)
          is included, as it is in the product.
SAME-WORK the same database work as a step, done by hand on ONE async psycopg connection
          (autocommit, like the runtime's pool; BEGIN/COMMIT by ``transaction()``): the
          recall statement that ``MemoryService.snapshot`` ran in OURS's warm-up run, with
          the parameters it ran with (step by step: the same query vectors, k, weights; only
          ``agent_id`` is this baseline's own agent, whose memories grow as OURS's do, and
          ``now`` is fresh), rows fetched as dicts like the pool does; then one transaction
          with three INSERTs (``run_steps``, ``audit_log``, ``memories`` with a 384-dim
          vector). The statement and its parameters are captured from the runtime's own
          connections, never copied into this file, so the baseline follows the product.
WRITE-ONLY the three INSERTs alone (issue 2's baseline, kept as the second ratio).

Both baselines send values (jsonb text copied byte for byte from the rows OURS wrote, ids,
timestamps, the vector) prepared outside the timed part. All three run on the same database
in the same process, warmed up first, interleaved run by run (the order rotating every run)
so drift cancels. Reported per step: median and p95 over the R runs of (run wall time / N),
steps/s, and the ratios ours/same-work (target ≤ 1.3×) and ours/write-only (issue 2's
≤ 1.5×). The baselines send their INSERTs one round trip each (five a transaction with BEGIN
and COMMIT, where OURS needs three); a reference line also times the same-work baseline
with its INSERTs pipelined as OURS's are, so the ratio can be read with round trips counted
alike. An instrumented pass afterwards splits OURS's step into its phases (exclusive times).

Zero-latency stand-ins:
- model: ``ScriptedModelClient`` whose responder reads each request's ``response_schema``:
  ``candidates`` → one ``tick`` candidate (a finish at the last step, read from the
  prompt's "Step i of N."), ``scores`` → a score per candidate, ``importance`` → 5;
- embedder: ``HashEmbedder`` (``embedding_backend="hash"``);
- importance: ``HeuristicImportanceScorer()`` is passed to ``Runtime.open``, so no model call
  is spent on importance (the responder's ``importance`` answer is only a safety net).

Run: ``.venv/bin/python bench/cycle_overhead.py [--steps 8] [--runs 30]``; ``--profile``
adds a cProfile of OURS's runs, ``--check`` exits 1 when the same-work target is missed.
Only the public API drives OURS (``Runtime.open``, ``create_agent``, ``run_autonomous``); the
capture and the phase breakdown wrap attributes of this process's runtime objects.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import itertools
import json
import math
import os
import pstats
import re
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import psycopg
from _scratch import scratch_data_dir
from pgvector import Vector
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg.rows import dict_row

from cortex_ray import AgentMode, RunStatus, Runtime, Settings, Step, run_main, run_stoppable
from cortex_ray.act import Tool, ToolContext
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient

TARGET = 1.3  # ours / same-work baseline (issue 12)
WRITE_ONLY_TARGET = 1.5  # ours / write-only baseline (issue 2)
GOAL = "Report the current date and time."

# --- the zero-latency model ---------------------------------------------------------------

_STEP = re.compile(r"Step (\d+) of (\d+)\.")


def _act(step: int) -> str:
    # A new argument each step: the planner treats a call made again with the same
    # arguments as a repeat (it asks for the answer instead, and ends a run of repeats).
    call = {"tool": "tick", "args": {"n": step}, "rationale": "count the step"}
    return json.dumps({"candidates": [call]})


async def _tick(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"n": args["n"], "utc": datetime.now(UTC).isoformat(timespec="seconds")}


# The built-ins (what an agent gets by default) and the bench's tick.
AGENT_TOOLS = ["current_time", "memory_search", "remember_fact", "propose_procedural_edit", "tick"]

TICK = Tool(
    name="tick",
    description="Count a step and read the clock.",
    handler=_tick,
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
    idempotent=True,
)
_FINISH = json.dumps(
    {"candidates": [{"finish": True, "message": "It is now.", "rationale": "the objective is met"}]}
)
_IMPORTANCE = json.dumps({"importance": 5})


def respond(request: ChatRequest) -> str:
    """Answer by the schema the request asks for; finish at the last step of the budget."""
    props = (request.response_schema or {}).get("properties", {})
    if "candidates" in props:
        for message in reversed(request.messages):
            found = _STEP.search(message.content or "") if message.role == "user" else None
            if found:
                return _FINISH if int(found[1]) >= int(found[2]) else _act(int(found[1]))
        return _act(0)
    if "scores" in props:
        n = int(props["scores"].get("maxItems", 1))
        return json.dumps({"scores": [5] * n})
    if "best" in props:
        listed = props["best"]["enum"]
        return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
    if "importance" in props:
        return _IMPORTANCE
    raise ValueError(f"unexpected request schema {request.schema_name!r}")


# --- statistics ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# --- OURS ---------------------------------------------------------------------------------


class Ours:
    def __init__(self, runtime: Runtime, model: ScriptedModelClient, org: str, agent_id: uuid.UUID):
        self.runtime = runtime
        self.model = model
        self.org = org
        self.agent_id = agent_id

    async def run(
        self, steps: int, *, collect: bool = True
    ) -> tuple[float, list[float], list[Step]]:
        """One run: wall seconds, the gaps between consecutive steps, and the steps."""
        marks: list[float] = []
        recorded: list[Step] = []

        def on_step(step: Step) -> None:
            marks.append(time.perf_counter())
            recorded.append(step)

        self.model.requests.clear()
        if collect:
            gc.collect()
        started = time.perf_counter()
        run = await self.runtime.run_autonomous(
            self.org, self.agent_id, GOAL, max_steps=steps, on_step=on_step
        )
        wall = time.perf_counter() - started
        if run.status is not RunStatus.COMPLETED or len(run.steps) != steps:
            raise RuntimeError(
                f"benchmark run ended {run.status.value} after {len(run.steps)} steps: {run.reason}"
            )
        gaps = [b - a for a, b in itertools.pairwise(marks)]
        return wall, gaps, recorded


# --- BASELINE -----------------------------------------------------------------------------

_INSERT_STEP = """
INSERT INTO run_steps (org_id, run_id, step_index, decision, candidates, selected, action,
                       action_type, observation, message, created_at)
VALUES (%s, %s, %s, %s, %s::json, %s, %s::json, %s, %s::json, %s, %s)
"""
_INSERT_AUDIT = """
INSERT INTO audit_log (org_id, principal_id, agent_id, mode, tool, action_type, status, reason,
                       args, duration_ms, run_id, step_index, session_id, idempotency_key)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)
"""
_INSERT_MEMORY = """
INSERT INTO memories (org_id, id, agent_id, kind, subject, content, embedding, importance,
                      valid_from, run_id, step_index, metadata)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)
"""


Recall = tuple[Any, dict[str, Any]]  # (statement, parameters) as the runtime ran it


class RecallCapture:
    """Records the statements ``runtime.memory.snapshot`` runs, by wrapping (on these
    instances only) ``snapshot`` and the ``connection``/``transaction`` of ``runtime.db``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.snapshots: list[list[Recall]] = []  # per snapshot call, its statements
        self.queries: list[str] = []
        self._inside = False

    def __enter__(self) -> RecallCapture:
        memory, db = self.runtime.memory, self.runtime.db
        original_snapshot = memory.snapshot

        async def snapshot(*args: Any, **kwargs: Any) -> Any:
            self.snapshots.append([])
            self.queries.append(kwargs["query"])
            self._inside = True
            try:
                return await original_snapshot(*args, **kwargs)
            finally:
                self._inside = False

        memory.snapshot = snapshot
        for method in ("connection", "transaction"):
            setattr(db, method, self._recording(getattr(db, method)))
        return self

    def _recording(self, original: Callable[[], Any]) -> Callable[[], Any]:
        capture = self

        class Recording:
            """The pool's connection, with ``execute`` noting what the snapshot sends."""

            def __init__(self, conn: Any) -> None:
                self._conn = conn

            async def execute(self, statement: Any, params: Any = None, **kw: Any) -> Any:
                if capture._inside:
                    capture.snapshots[-1].append((statement, dict(params or {})))
                return await self._conn.execute(statement, params, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

        @contextlib.asynccontextmanager
        async def recorded() -> AsyncIterator[Any]:
            async with original() as conn:
                yield Recording(conn) if capture._inside else conn

        return recorded

    def __exit__(self, *exc: object) -> None:
        # The wrappers are instance attributes: deleting them restores the class's methods.
        for owner, name in (
            (self.runtime.memory, "snapshot"),
            (self.runtime.db, "connection"),
            (self.runtime.db, "transaction"),
        ):
            with contextlib.suppress(AttributeError):
                delattr(owner, name)

    def per_step(self) -> list[Recall]:
        """The one statement of each snapshot, in step order."""
        for i, statements in enumerate(self.snapshots):
            if len(statements) != 1:
                raise RuntimeError(
                    f"snapshot {i} ran {len(statements)} statements; the same-work baseline "
                    "replays exactly one read per cycle"
                )
        return [statements[0] for statements in self.snapshots]


class Baseline:
    """Per step: the captured recall statement (if any), then three INSERTs in one
    transaction, on one async connection."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        org: str,
        agent_id: uuid.UUID,
        recalls: list[Recall] | None = None,
    ):
        self.conn = conn
        self.org = org
        self.agent_id = agent_id
        self.recalls = recalls
        self.template: dict[str, Any] = {}

    async def copy_rows_of(self, run_id: uuid.UUID, org: str) -> None:
        """Take the payloads (jsonb as text, content, vector) from a step OURS wrote."""
        rows = {}
        async with self.conn.transaction():
            cur = self.conn.cursor(row_factory=dict_row)
            for name, query in (
                (
                    "step",
                    "SELECT candidates::text, selected, action::text, action_type,"
                    " observation::text, message FROM run_steps"
                    " WHERE org_id = %s AND run_id = %s AND decision = 'ACT' ORDER BY step_index",
                ),
                (
                    "audit",
                    "SELECT principal_id, mode, tool, action_type, status, reason,"
                    " args::text, duration_ms, idempotency_key FROM audit_log"
                    " WHERE org_id = %s AND run_id = %s ORDER BY id",
                ),
                (
                    "memory",
                    "SELECT kind, subject, content, embedding, importance, metadata::text"
                    " FROM memories WHERE org_id = %s AND run_id = %s AND step_index IS NOT NULL"
                    " ORDER BY step_index",
                ),
            ):
                await cur.execute(query, (org, run_id))
                rows[name] = await cur.fetchone()
        if not all(rows.values()):
            raise RuntimeError("the warm-up run left no rows to copy")
        self.template = rows

    async def prepare(self, steps: int) -> list[tuple[Any, ...]]:
        """Everything one run sends, plus its parent ``task_runs`` row (committed, untimed)."""
        run_id = uuid.uuid4()
        async with self.conn.transaction():
            await self.conn.execute(
                "INSERT INTO task_runs (org_id, id, agent_id, goal, status, max_steps)"
                " VALUES (%s, %s, %s, %s, 'RUNNING', %s)",
                (self.org, run_id, self.agent_id, GOAL, steps),
            )
        s, a, m = self.template["step"], self.template["audit"], self.template["memory"]
        now = datetime.now(UTC)
        vector = m["embedding"]
        if not isinstance(vector, Vector):
            vector = Vector(np.asarray(vector, np.float32))
        org, agent = self.org, self.agent_id
        out: list[tuple[Any, ...]] = []
        for i in range(steps):
            recall = None
            if self.recalls is not None:
                statement, params = self.recalls[i % len(self.recalls)]
                recall = (statement, params | {"agent_id": agent, "now": now})
            step = (org, run_id, i, "ACT", s["candidates"], s["selected"], s["action"],
                    s["action_type"], s["observation"], s["message"], now)  # fmt: skip
            audit = (org, a["principal_id"], agent, a["mode"], a["tool"], a["action_type"],
                     a["status"], a["reason"], a["args"], a["duration_ms"], run_id, i, None,
                     f"{run_id}:{i}" if a["idempotency_key"] else None)  # fmt: skip
            memory = (org, uuid.uuid4(), agent, m["kind"], m["subject"], m["content"], vector,
                      m["importance"], now, run_id, i, m["metadata"])  # fmt: skip
            out.append((recall, step, audit, memory))
        return out

    async def run(
        self, params: list[tuple[Any, ...]], *, pipelined: bool = False
    ) -> tuple[float, list[float], float, float]:
        """Wall seconds, each step's seconds, the seconds in the INSERTs and in the recall.

        ``pipelined``: the INSERTs go in one pipeline inside the transaction (BEGIN, one
        round trip for the three, COMMIT), as the runtime sends its step's rows; only for
        the reference line that compares like with like on round trips."""
        conn = self.conn
        per_step: list[float] = []
        in_statements = in_recall = 0.0
        gc.collect()
        started = time.perf_counter()
        for recall, step, audit, memory in params:
            t0 = time.perf_counter()
            if recall is not None:
                # Autocommit, one statement, rows as dicts: what the runtime's read does.
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(*recall)
                await cur.fetchall()
                in_recall += time.perf_counter() - t0
            async with conn.transaction():
                t1 = time.perf_counter()
                async with conn.pipeline() if pipelined else contextlib.nullcontext():
                    await conn.execute(_INSERT_STEP, step)
                    await conn.execute(_INSERT_AUDIT, audit)
                    await conn.execute(_INSERT_MEMORY, memory)
                in_statements += time.perf_counter() - t1
            per_step.append(time.perf_counter() - t0)
        return time.perf_counter() - started, per_step, in_statements, in_recall


# --- where OURS's step goes ---------------------------------------------------------------


class PhaseTimer:
    """Exclusive wall time per phase, by wrapping methods of one Runtime's instances.

    A wrapped call nested in another is subtracted from its parent, so phases add up to
    the time they cover; what no wrapper covers is reported as the rest.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[Any]] = []  # [phase, time of wrapped children] per open call

    def _enter(self, phase: str) -> float:
        self._stack.append([phase, 0.0])
        return time.perf_counter()

    def _exit(self, started: float) -> None:
        elapsed = time.perf_counter() - started
        phase, children = self._stack.pop()
        self.totals[phase] += elapsed - children
        self.calls[phase] += 1
        if self._stack:
            self._stack[-1][1] += elapsed

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = self._enter(phase)
            try:
                return await original(*args, **kwargs)
            finally:
                self._exit(started)

        setattr(owner, name, timed)

    def wrap_sync(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = self._enter(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self._exit(started)

        setattr(owner, name, timed)

    def wrap_connections(self, db: Any, method: str, phases: dict[str | None, str]) -> None:
        """Time ``db.<method>()`` blocks (``transaction``, ``connection``) opened directly by
        the cycle (key ``None``) or inside a wrapped call of a phase named in ``phases``;
        others count to their caller."""
        original: Callable[[], Any] = getattr(db, method)

        @contextlib.asynccontextmanager
        async def timed() -> AsyncIterator[Any]:
            phase = phases.get(self._stack[-1][0] if self._stack else None)
            if phase is None:
                async with original() as conn:
                    yield conn
                return
            started = self._enter(phase)
            try:
                async with original() as conn:
                    yield conn
            finally:
                self._exit(started)

        setattr(db, method, timed)


SNAPSHOT = "PERCEIVE: snapshot, embed query + rows → MemoryRecord"


def instrument(runtime: Runtime) -> PhaseTimer:
    """Wrap the cycle's parts (instances of this process's runtime only).

    The parts are reached by attribute; one the runtime no longer has is skipped (and then
    counts to its caller), so a refactor of the runtime narrows the breakdown instead of
    breaking the benchmark.
    """
    timer = PhaseTimer()

    def wrap(owner_name: str, name: str, phase: str) -> None:
        owner = getattr(runtime, owner_name, None)
        if owner is not None and callable(getattr(owner, name, None)):
            timer.wrap(owner, name, phase)

    for name in ("get_agent", "create_run", "get_run"):
        wrap("store", name, "run bookkeeping: get_agent, create_run")
    wrap("memory", "snapshot", SNAPSHOT)
    wrap("assembler", "assemble", "PERCEIVE: build WorkingMemory")
    wrap("autonomous", "decide", "DECIDE: render, structured call, validate")
    wrap("dispatcher", "execute", "ACT: invocation gate + tick")
    wrap("memory", "prepare", "LEARN: prepare memory (embed, importance)")
    for name in ("insert_step", "insert_audit", "finish_run"):
        wrap("store", name, "LEARN: INSERT/UPDATE statements (queued)")
    wrap("memory", "write_prepared", "LEARN: INSERT/UPDATE statements (queued)")
    wrap("memory", "insert_prepared", "LEARN: INSERT/UPDATE statements (queued)")
    timer.wrap_connections(
        runtime.db,
        "transaction",
        {
            # The step's statements are pipelined: their calls only queue them, and the
            # server's work is waited for when the pipeline syncs, before COMMIT.
            None: "LEARN: checkout, BEGIN, pipeline sync, COMMIT",
            SNAPSHOT: "PERCEIVE: snapshot SQL (pool checkout, statement, fetch)",
        },
    )
    if hasattr(runtime.db, "connection"):  # single-statement reads outside a transaction
        timer.wrap_connections(
            runtime.db,
            "connection",
            {SNAPSHOT: "PERCEIVE: snapshot SQL (pool checkout, statement, fetch)"},
        )
    return timer


# --- the benchmark ------------------------------------------------------------------------


async def bench(args: argparse.Namespace, data_dir: Path) -> int:
    n, runs = args.steps, args.runs
    settings = Settings(
        data_dir=data_dir,
        database_url=args.database_url,
        model_backend="none",
        embedding_backend="hash",
        importance_scoring="heuristic",
        max_steps_limit=max(64, n),
    )
    model = ScriptedModelClient(responder=respond, name="zero-latency")
    runtime = await Runtime.open(
        settings,
        model=model,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[TICK],
    )
    conn = None
    try:
        org = f"bench-{uuid.uuid4().hex[:10]}"
        ours_agent = await runtime.create_agent(
            org, "bench-ours", mode=AgentMode.AUTONOMOUS, tools=AGENT_TOOLS
        )
        same_agent = await runtime.create_agent(
            org, "bench-same", mode=AgentMode.AUTONOMOUS, tools=AGENT_TOOLS
        )
        base_agent = await runtime.create_agent(
            org, "bench-baseline", mode=AgentMode.AUTONOMOUS, tools=AGENT_TOOLS
        )
        ours = Ours(runtime, model, org, ours_agent.id)

        # Like the runtime's pool: autocommit, explicit BEGIN/COMMIT via transaction(), the
        # vector type, and the session settings its connections get (read, not copied).
        conn = await psycopg.AsyncConnection.connect(runtime.db.dsn, autocommit=True)
        await register_vector_async(conn)
        async with runtime.db.connection() as pooled:
            cur = await pooled.execute("SHOW hnsw.iterative_scan")
            row = await cur.fetchone()
        iterative_scan = next(iter(row.values())) if isinstance(row, dict) else row[0]
        await conn.execute(
            sql.SQL("SET hnsw.iterative_scan = {}").format(sql.Literal(iterative_scan))
        )
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        server = row[0] if row else "?"

        # Warm up (imports, prepared statements, caches); the first run's snapshots give
        # the recall statements and OURS's rows the payloads the baselines replay.
        with RecallCapture(runtime) as capture:
            _, _, steps = await ours.run(n)
        recalls = capture.per_step()
        if len(recalls) != n:
            raise RuntimeError(f"{len(recalls)} snapshots in a run of {n} steps")
        same_work = Baseline(conn, org, same_agent.id, recalls)
        baseline = Baseline(conn, org, base_agent.id)
        for b in (same_work, baseline):
            await b.copy_rows_of(steps[0].run_id, org)
        for _ in range(args.warmup):
            await ours.run(n)
            await same_work.run(await same_work.prepare(n))
            await baseline.run(await baseline.prepare(n))

        ours_step: list[float] = []  # per run: wall / N
        same_step: list[float] = []
        base_step: list[float] = []
        ours_gaps: list[float] = []  # individual steps
        same_each: list[float] = []
        base_each: list[float] = []
        for r in range(runs):
            same_params = await same_work.prepare(n)
            base_params = await baseline.prepare(n)

            async def run_ours() -> None:
                wall, gaps, _ = await ours.run(n)
                ours_step.append(wall / n * 1000)
                ours_gaps.extend(g * 1000 for g in gaps)

            async def run_same(params: list[tuple[Any, ...]] = same_params) -> None:
                wall, each, _, _ = await same_work.run(params)
                same_step.append(wall / n * 1000)
                same_each.extend(e * 1000 for e in each)

            async def run_base(params: list[tuple[Any, ...]] = base_params) -> None:
                wall, each, _, _ = await baseline.run(params)
                base_step.append(wall / n * 1000)
                base_each.extend(e * 1000 for e in each)

            # Rotate the order so that none of the three always follows the same one.
            kinds = [run_ours, run_same, run_base]
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                await kind()

        profile_text = ""
        if args.profile:  # uninstrumented runs, without the forced collections
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(max(5, runs // 3)):
                await ours.run(n, collect=False)
            profiler.disable()
            buf = io.StringIO()
            stats = pstats.Stats(profiler, stream=buf).strip_dirs()
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(45)
            profile_text = buf.getvalue()

        # Reference, uninstrumented: the same-work baseline with its INSERTs pipelined the way
        # the runtime pipelines its step's statements (three round trips instead of five),
        # interleaved with OURS: the ratio with round trips counted alike.
        piped_ours: list[float] = []
        piped_same: list[float] = []
        for r in range(runs):
            params = await same_work.prepare(n)
            for first in (r % 2 == 0, r % 2 == 1):
                if first:
                    wall, _, _ = await ours.run(n)
                    piped_ours.append(wall / n * 1000)
                else:
                    wall, _, _, _ = await same_work.run(params, pipelined=True)
                    piped_same.append(wall / n * 1000)

        # Reference points, uninstrumented: the cycle's memory read alone, the same statement
        # by hand, one round trip (SELECT 1), and a bare transaction (BEGIN; SELECT 1;
        # COMMIT: three round trips).
        query = capture.queries[-1]
        statement, params = recalls[-1]
        snapshot_ms, statement_ms, round_trip_ms, empty_txn_ms = [], [], [], []
        for _ in range(50):
            t0 = time.perf_counter()
            await runtime.memory.snapshot(org_id=org, agent_id=ours_agent.id, query=query)
            snapshot_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(statement, params | {"now": datetime.now(UTC)})
            await cur.fetchall()
            statement_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await conn.execute("SELECT 1")
            round_trip_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            async with conn.transaction():
                await conn.execute("SELECT 1")
            empty_txn_ms.append((time.perf_counter() - t0) * 1000)

        # Phase breakdown: separate instrumented runs (not part of the comparison), each
        # next to a baseline run so the two stay comparable.
        timer = instrument(runtime)
        breakdown_runs = max(5, runs // 3)
        walls, base_walls, base_statements, base_recalls = [], [], [], []
        for _ in range(breakdown_runs):
            wall, _, _ = await ours.run(n)
            walls.append(wall)
            base_wall, _, in_statements, in_recall = await same_work.run(await same_work.prepare(n))
            base_walls.append(base_wall)
            base_statements.append(in_statements)
            base_recalls.append(in_recall)
        async with runtime.db.connection() as pooled:
            cur = await pooled.execute(
                "SELECT a.name, count(*) AS n FROM memories m JOIN agents a"
                " ON a.org_id = m.org_id AND a.id = m.agent_id"
                " WHERE m.org_id = %s GROUP BY a.name ORDER BY a.name",
                (org,),
            )
            memory_counts = {r["name"]: r["n"] for r in await cur.fetchall()}
    finally:
        if conn is not None:
            await conn.close()
        await runtime.close()

    # --- report ---------------------------------------------------------------------------
    def line(label: str, values: list[float]) -> str:
        med, p95 = statistics.median(values), percentile(values, 95)
        return f"{label:<44} {med:>9.2f} {p95:>9.2f} {1000 / med:>9.0f}"

    where = "configured DSN" if args.database_url else f"embedded, {data_dir}"
    print(
        f"Cycle overhead: {n} steps/run, {runs} runs interleaved after {args.warmup} warm-up "
        f"runs; PostgreSQL {server} ({where})"
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; model: ScriptedModelClient "
        "(zero latency); embedder: HashEmbedder(384); importance: HeuristicImportanceScorer"
    )
    print()
    print(
        f"{'per step (run wall time / N, over runs)':<44} {'median ms':>9} {'p95 ms':>9} "
        f"{'steps/s':>9}"
    )
    print(line("cortex-ray Runtime.run_autonomous", ours_step))
    print(line("same-work baseline: recall + txn, 3 INSERTs", same_step))
    print(line("write-only baseline: 1 txn, 3 INSERTs", base_step))
    ratio = statistics.median(ours_step) / statistics.median(same_step)
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"ratio ours/same-work baseline (medians): {ratio:.2f}×   target ≤ {TARGET}×   {verdict}")
    write_ratio = statistics.median(ours_step) / statistics.median(base_step)
    write_verdict = "PASS" if write_ratio <= WRITE_ONLY_TARGET else "FAIL"
    print(
        f"ratio ours/write-only baseline (medians): {write_ratio:.2f}×   "
        f"target ≤ {WRITE_ONLY_TARGET}×   {write_verdict}"
    )
    print()
    print(f"{'individual steps':<44} {'median ms':>9} {'p95 ms':>9} {'steps/s':>9}")
    print(line("cortex-ray, step-to-step (on_step gaps)", ours_gaps))
    print(line("same-work baseline, recall + transaction", same_each))
    print(line("write-only baseline, one transaction", base_each))
    print()
    per_step_total = statistics.mean(walls) / n * 1000
    print(
        f"Reference (medians of 50): MemoryService.snapshot alone "
        f"{statistics.median(snapshot_ms):.2f} ms; its statement by hand "
        f"{statistics.median(statement_ms):.2f} ms; one round trip (SELECT 1) "
        f"{statistics.median(round_trip_ms):.2f} ms; BEGIN; SELECT 1; COMMIT "
        f"{statistics.median(empty_txn_ms):.2f} ms"
    )
    print(
        f"Same-work baseline with its 3 INSERTs pipelined like the runtime's ({len(piped_same)} "
        f"runs, interleaved): {statistics.median(piped_same):.2f} ms/step; ours alongside "
        f"{statistics.median(piped_ours):.2f} ms/step; ratio "
        f"{statistics.median(piped_ours) / statistics.median(piped_same):.2f}×"
    )
    counts = ", ".join(f"{name} {count}" for name, count in memory_counts.items())
    print(f"Memories per agent at the end: {counts}")
    print()
    base_total = statistics.mean(base_walls) / n * 1000
    base_stmt = statistics.mean(base_statements) / n * 1000
    base_recall = statistics.mean(base_recalls) / n * 1000
    print(
        f"Where a cortex-ray step goes ({breakdown_runs} instrumented runs, each next to a "
        f"same-work baseline run; exclusive ms per step, mean):"
    )
    covered = 0.0
    for phase, total in sorted(timer.totals.items(), key=lambda kv: -kv[1]):
        ms = total / (breakdown_runs * n) * 1000
        covered += ms
        calls = timer.calls[phase] / (breakdown_runs * n)
        print(f"  {phase:<62} {ms:>7.3f}  ({calls:.2f} calls/step)")
    print(
        f"  {'rest (Step objects, loop, on_step, instrumentation)':<62} "
        f"{per_step_total - covered:>7.3f}"
    )
    print(f"  {'total':<62} {per_step_total:>7.3f}")
    print("same-work baseline alongside:")
    print(f"  {'recall statement + fetch':<62} {base_recall:>7.3f}")
    print(f"  {'3 INSERTs':<62} {base_stmt:>7.3f}")
    print(f"  {'BEGIN + COMMIT (+ loop)':<62} {base_total - base_stmt - base_recall:>7.3f}")
    print(f"  {'total':<62} {base_total:>7.3f}")
    if profile_text:
        print()
        print(f"cProfile of {breakdown_runs} cortex-ray runs:")
        print(profile_text)
    return 1 if args.check and verdict == "FAIL" else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per run (max_steps)")
    parser.add_argument("--runs", type=int, default=30, help="measured runs of each kind")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up runs of each kind")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="embedded PostgreSQL folder (default: a fresh one under /tmp, removed afterwards)",
    )
    parser.add_argument("--database-url", default=None, help="use this PostgreSQL instead")
    parser.add_argument("--profile", action="store_true", help="also cProfile cortex-ray runs")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()
    if args.steps < 2 or args.runs < 1:
        parser.error("--steps must be >= 2 (acts, then a finish) and --runs >= 1")

    with scratch_data_dir(args.data_dir) as data_dir:
        return run_stoppable(bench(args, data_dir))


if __name__ == "__main__":
    sys.exit(run_main(main))
