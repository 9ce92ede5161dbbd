"""Session density (issue 3): what a live session actor costs, and that passivation bounds it.

Three measurements on a local Ray (``num_cpus=2``, no dashboard) and the embedded PostgreSQL,
with a zero-latency ``ScriptedModelClient``, ``HashEmbedder`` and
``HeuristicImportanceScorer`` inside every actor (no model weights load):

1. MEMORY PER LIVE SESSION: K sessions get one turn each and stay live; the RSS, PSS and
   USS of each session actor's process (``psutil``), and the growth of the whole cluster's
   PSS per session.
2. REACTIVATION: a session is passivated (its actor exits) and the next message brings it
   back; the time of that turn (actor start + ``Runtime`` open + the turn) against a turn
   to a live actor and the same turn run in the benchmark's own process. R rounds.
3. DENSITY CURVE: N sessions created in sequence (one turn each) under a live cap of C;
   every S sessions: live session actors, and the total RSS and PSS of every process of the
   cluster (Ray's own processes, workers, the driver, PostgreSQL). Flat = bounded.

Run from the repository root: ``.venv/bin/python bench/session_density.py`` (defaults:
``--sessions 1000 --cap 50``); ``--max-seconds`` stops the curve early (printing how far it
got), for machines where N sessions take too long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Benchmark the working tree this file sits in; Ray workers inherit PYTHONPATH.
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import psutil  # noqa: E402
import ray  # noqa: E402
from _scratch import scratch_data_dir  # noqa: E402

from actors import DIRECTORY_NAME, SessionManager, SessionPolicy  # noqa: E402
from cortex_ray import Grant, Principal, Runtime, Settings, reclaim_signals, run_main, run_stoppable  # noqa: E402
from cortex_ray.memory import EMBEDDING_DIM, HeuristicImportanceScorer  # noqa: E402
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient  # noqa: E402
from cortex_ray.storage import Database  # noqa: E402

MB = 1024 * 1024


# --- the zero-latency runtime shipped to the actors (this module is __main__, so Ray's
# cloudpickle sends these functions by value) -----------------------------------------------


def respond(request: ChatRequest) -> str:
    if request.response_schema is not None:
        if request.schema_name == "facts":
            return json.dumps({"facts": []})
        raise ValueError(f"unexpected structured call {request.schema_name!r}")
    said = [m.content or "" for m in request.messages if m.role == "user"]
    return f"echo: {said[-1] if said else ''}"


async def scripted_runtime(settings: Settings, db: Database | None = None) -> Runtime:
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=respond, keep_requests=0),  # no request log
        embedder=HashEmbedder(EMBEDDING_DIM),
        importance=HeuristicImportanceScorer(),
        db=db,
    )


# --- memory of processes ------------------------------------------------------------------


def memory_of(pid: int) -> dict[str, float] | None:
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return {"rss": info.rss / MB, "pss": info.pss / MB, "uss": info.uss / MB}


def cluster_processes(data_dir: Path | None) -> list[psutil.Process]:
    """Every process of this benchmark: the driver and what it started (Ray's processes and
    workers are its descendants), and the embedded PostgreSQL's server processes."""
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    pid_file = data_dir / "pg" / "postmaster.pid" if data_dir is not None else None
    if pid_file is not None and pid_file.exists():
        try:
            postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
            procs += [postmaster, *postmaster.children(recursive=True)]
        except (psutil.NoSuchProcess, ValueError, IndexError):
            pass
    return list({p.pid: p for p in procs}.values())


def cluster_memory(data_dir: Path | None) -> dict[str, float]:
    total = {"rss": 0.0, "pss": 0.0, "procs": 0.0}
    for p in cluster_processes(data_dir):
        m = memory_of(p.pid)
        if m is None:
            continue
        total["rss"] += m["rss"]
        total["pss"] += m["pss"]
        total["procs"] += 1
    return total


def live_session_actors(namespace: str) -> list[str]:
    """Session actors alive in the namespace: named after their session (the cold path) or
    warm ones (``cortex-ray:warm/...``, adopted or not): every actor but the directory."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace and a["name"] != DIRECTORY_NAME
    ]


async def bound_session_actors(namespace: str) -> int:
    """Live actors serving a session (not the unbound warm ones), asking each actor."""
    bound = 0
    for name in live_session_actors(namespace):
        try:
            status = await ray.get_actor(name, namespace=namespace).status.remote()
        except (ray.exceptions.RayActorError, ValueError):
            continue  # gone meanwhile
        bound += status["name"] is not None
    return bound


async def wait_live_at_most(namespace: str, n: int, within: float = 30.0) -> int:
    deadline = time.monotonic() + within
    live = await bound_session_actors(namespace)
    while live > n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        live = await bound_session_actors(namespace)
    return live


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


# --- the benchmark ------------------------------------------------------------------------


async def bench(args: argparse.Namespace, data_dir: Path) -> None:
    base = Settings(
        data_dir=data_dir,
        database_url=args.database_url,
        embedding_backend="hash",
        model_backend="none",
    )
    db = await Database.open(base.storage)
    pg_dir = None if args.database_url else data_dir
    local = await scripted_runtime(base, db)
    # Actors: the running server's DSN, one pooled connection each (cap × pool must fit
    # PostgreSQL's max_connections, 100 by default).
    settings = base.model_copy(
        update={"database_url": db.dsn, "pool_min_size": 1, "pool_max_size": 1}
    )
    org = f"bench-{uuid.uuid4().hex[:8]}"
    agent = await local.create_agent(org, "density")
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))

    async def new_session() -> uuid.UUID:
        return (await local.open_session(org, agent.id, alice)).id

    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, namespace="bench", log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    print(f"ray.init {time.monotonic() - t0:.1f} s; ray {ray.__version__}, {os.cpu_count()} CPUs")
    try:
        # 1. memory per live session --------------------------------------------------------
        ns1 = f"density-live-{uuid.uuid4().hex[:6]}"
        manager = SessionManager(
            settings,
            factory=scripted_runtime,
            policy=SessionPolicy(
                namespace=ns1,
                max_live_sessions=10_000,
                idle_timeout_s=3600,
                warm_actors=args.warm_actors,
            ),
        )
        await manager.live_sessions()  # the directory is up before the baseline
        await asyncio.sleep(2.0)
        before = cluster_memory(pg_dir)
        ids = []
        for _ in range(args.live):
            sid = await new_session()
            await manager.turn(org, sid, alice, "hello")
            ids.append(sid)
        await asyncio.sleep(2.0)
        after = cluster_memory(pg_dir)
        per_actor: list[dict[str, float]] = []
        for sid in ids:
            handle = await manager.session_actor(org, sid)
            assert handle is not None, sid
            m = memory_of(await handle.pid.remote())
            if m is not None:
                per_actor.append(m)
        print(f"\n1. Memory per live session actor ({args.live} live sessions, one turn each)")
        for key in ("rss", "pss", "uss"):
            values = [m[key] for m in per_actor]
            print(
                f"   {key.upper()} per actor process: median {statistics.median(values):6.1f} MB"
                f"   min {min(values):6.1f}   max {max(values):6.1f}"
            )
        grow = (after["pss"] - before["pss"]) / args.live
        print(
            f"   whole cluster: PSS {before['pss']:.0f} → {after['pss']:.0f} MB "
            f"(+{grow:.1f} MB per session), RSS {before['rss']:.0f} → {after['rss']:.0f} MB, "
            f"{before['procs']:.0f} → {after['procs']:.0f} processes"
        )

        # 2. reactivation -------------------------------------------------------------------
        warm, cold, inproc = [], [], []
        sid = ids[0]
        session = await local.store.get_session(org, sid)
        for _ in range(args.reactivations):
            t = time.perf_counter()
            await local.run_turn(session, alice, "in process")
            inproc.append(time.perf_counter() - t)
            t = time.perf_counter()
            await manager.turn(org, sid, alice, "warm")
            warm.append(time.perf_counter() - t)
            assert await manager.passivate(org, sid)
            await wait_live_at_most(ns1, args.live - 1)
            await asyncio.sleep(0.5)  # let the exit settle; Ray may prestart a worker
            # The warm pool refills in the background (one actor start each); give it the
            # time a person takes to type the next message, up to 5 s.
            for _ in range(50):
                if len(await manager.directory().warm_actors.remote()) or not args.warm_actors:
                    break
                await asyncio.sleep(0.1)
            t = time.perf_counter()
            reply = await manager.turn(org, sid, alice, "back?")
            cold.append(time.perf_counter() - t)
            assert reply.reply == "echo: back?", reply
        turns = await local.store.conversation(org, sid)
        print(f"\n2. Reactivation ({args.reactivations} rounds; history kept: {len(turns)} turns)")
        print(
            f"   same turn in this process:    median {statistics.median(inproc) * 1000:7.1f} ms"
            f"   p95 {pct(inproc, 95) * 1000:7.1f} ms   (Runtime.run_turn, no actor)"
        )
        print(
            f"   turn to a live actor:         median {statistics.median(warm) * 1000:7.1f} ms"
            f"   p95 {pct(warm, 95) * 1000:7.1f} ms"
        )
        print(
            f"   turn to a passivated session: median {statistics.median(cold) * 1000:7.1f} ms"
            f"   p95 {pct(cold, 95) * 1000:7.1f} ms   "
            + (
                f"(a warm actor adopts it + turn; warm_actors={args.warm_actors})"
                if args.warm_actors
                else "(actor start + Runtime.open + turn; warm_actors=0)"
            )
        )
        for s in ids:
            await manager.passivate(org, s)
        await wait_live_at_most(ns1, 0)

        # 3. density curve ------------------------------------------------------------------
        ns3 = f"density-cap-{uuid.uuid4().hex[:6]}"
        capped = SessionManager(
            settings,
            factory=scripted_runtime,
            policy=SessionPolicy(
                namespace=ns3,
                max_live_sessions=args.cap,
                idle_timeout_s=3600,
                warm_actors=args.warm_actors,
            ),
        )
        await capped.live_sessions()
        await asyncio.sleep(2.0)
        print(
            f"\n3. {args.sessions} sessions in sequence, one turn each, live cap {args.cap} "
            f"(sampled every {args.sample_every})"
        )
        print("   sessions   live actors   cluster PSS MB   cluster RSS MB   processes   s/session")
        m = cluster_memory(pg_dir)
        print(f"   {0:8d}   {0:11d}   {m['pss']:14.0f}   {m['rss']:14.0f}   {m['procs']:9.0f}")
        started = time.monotonic()
        last = started
        done = 0
        curve = []
        for i in range(1, args.sessions + 1):
            sid = await new_session()
            await capped.turn(org, sid, alice, "hello")
            done = i
            if i % args.sample_every == 0 or i == args.sessions:
                live = await bound_session_actors(ns3)
                m = cluster_memory(pg_dir)
                now = time.monotonic()
                rate = (now - last) / (args.sample_every if i % args.sample_every == 0 else 1)
                last = now
                curve.append((i, live, m["pss"], m["rss"]))
                print(
                    f"   {i:8d}   {live:11d}   {m['pss']:14.0f}   {m['rss']:14.0f}"
                    f"   {m['procs']:9.0f}   {rate:9.2f}",
                    flush=True,
                )
            if args.max_seconds and time.monotonic() - started > args.max_seconds:
                break
        elapsed = time.monotonic() - started
        print(
            f"   {done} sessions in {elapsed:.0f} s ({elapsed / done:.2f} s each)"
            + (f"; stopped by --max-seconds {args.max_seconds}" if done < args.sessions else "")
        )
        tail = [c for c in curve if c[0] >= max(2 * args.cap, curve[0][0])]
        if len(tail) >= 2:
            pss = [c[2] for c in tail]
            print(
                f"   after {tail[0][0]} sessions: live actors {min(c[1] for c in tail)}–"
                f"{max(c[1] for c in tail)}, cluster PSS {min(pss):.0f}–{max(pss):.0f} MB "
                f"(spread {max(pss) - min(pss):.0f} MB)"
            )
    finally:
        ray.shutdown()
        await local.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="sessions for the curve (N)")
    parser.add_argument("--cap", type=int, default=50, help="live cap for the curve (C)")
    parser.add_argument("--sample-every", type=int, default=50, help="curve sample interval (S)")
    parser.add_argument("--live", type=int, default=20, help="live sessions for part 1 (K)")
    parser.add_argument("--reactivations", type=int, default=10, help="rounds for part 2 (R)")
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="stop the curve after this long"
    )
    parser.add_argument(
        "--warm-actors",
        type=int,
        default=SessionPolicy.model_fields["warm_actors"].default,
        help="SessionPolicy.warm_actors (0: every session starts its own actor, as before)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="embedded PostgreSQL data")
    parser.add_argument("--database-url", default=None, help="use this PostgreSQL instead")
    args = parser.parse_args()
    with scratch_data_dir(args.data_dir) as data_dir:
        run_stoppable(bench(args, data_dir))


if __name__ == "__main__":
    sys.exit(run_main(main))
