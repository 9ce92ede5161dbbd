"""Session actors on served models vs models in every actor (issue 4, point 3), side by side.

The same K interactive sessions, each given one real turn (packaged SmolLM2 replies, MiniLM
embeds), once with the models loaded in every session actor (``--in-process-models``: the
default factory with ``model_backend=local``, ``embedding_backend=local``) and once with
the models served by one ``serve.models`` app and reached through handles (``served``: the
default of ``python -m serve`` and the demo). Per mode: the PSS of each session actor's
process, the PSS of the model replicas (served only), the total, and the time of each
session's first turn (actor start + ``Runtime`` open + the turn).

Run from the repository root: ``.venv/bin/python bench/served_sessions.py --sessions 4``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil  # noqa: E402
import ray  # noqa: E402
from _scratch import scratch_data_dir  # noqa: E402
from ray import serve as ray_serve  # noqa: E402

from actors import SessionManager, SessionPolicy  # noqa: E402
from cortex_ray import Grant, Principal, Runtime, Settings, reclaim_signals, run_main, run_stoppable  # noqa: E402
from cortex_ray.models import HashEmbedder  # noqa: E402
from serve.models import run_local, served_settings, serving_config_for  # noqa: E402

MB = 1024 * 1024


def pss_of(pid: int) -> float:
    return float(psutil.Process(pid).memory_full_info().pss) / MB


def replica_pids(app: str) -> list[int]:
    """The processes of the model app's replicas (Serve names them ServeReplica:<app>:...)."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if f"ServeReplica:{app}:" in cmd:
            pids.append(proc.info["pid"])
    return pids


async def measure(mode: str, settings: Settings, k: int) -> dict[str, Any]:
    app = None
    if mode == "served":
        settings = served_settings(settings)
        config = serving_config_for(settings)
        assert config is not None
        app = run_local(config, port=8765, name=settings.models.app, route_prefix="/models")
    namespace = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    sessions = SessionManager(settings, policy=SessionPolicy(namespace=namespace))
    local = await Runtime.open(settings.model_copy(update={"model_backend": "none",
                                                           "embedding_backend": "hash"}),
                               model=None, embedder=HashEmbedder(384))  # fmt: skip
    org = f"bench-{uuid.uuid4().hex[:6]}"
    first_turn_s, actor_pss = [], []
    try:
        agent = await local.create_agent(org, "chat")
        alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
        for i in range(k):
            session = await local.open_session(org, agent.id, alice)
            t0 = time.perf_counter()
            result = await sessions.turn(org, session.id, alice, f"Say hello to guest {i}.")
            first_turn_s.append(time.perf_counter() - t0)
            assert result.reply
            actor = await sessions.session_actor(org, session.id)
            assert actor is not None
            actor_pss.append(pss_of(await actor.pid.remote()))
        replicas = sum(pss_of(p) for p in replica_pids(settings.models.app)) if app else 0.0
        return {
            "actor_pss": actor_pss,
            "replicas_pss": replicas,
            "first_turn_s": first_turn_s,
        }
    finally:
        await local.close()
        for name in [n for n in ray.util.list_named_actors(all_namespaces=True)
                     if n["namespace"] == namespace]:  # fmt: skip
            ray.kill(ray.get_actor(name["name"], namespace))
        if app is not None:
            app.stop()


async def main(args: argparse.Namespace) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    with scratch_data_dir(args.data_dir) as data_dir:
        settings = Settings(data_dir=data_dir, model_max_tokens=32, pool_max_size=2)
        db_runtime = await Runtime.open(settings, model=None, embedder=HashEmbedder(384))
        settings = settings.model_copy(update={"database_url": db_runtime.db.dsn})
        try:
            results = {
                "in-process": await measure("in-process", settings, args.sessions),
                "served": await measure("served", settings, args.sessions),
            }
        finally:
            await db_runtime.close()
    print(f"{args.sessions} session actors, one real SmolLM2 turn each; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'mode':12} {'PSS/actor MB':>13} {'replicas MB':>12} {'total MB':>9} "
          f"{'first turn s (median)':>22}")  # fmt: skip
    totals = {}
    for mode, r in results.items():
        per_actor = statistics.mean(r["actor_pss"])
        totals[mode] = sum(r["actor_pss"]) + r["replicas_pss"]
        print(f"{mode:12} {per_actor:13.0f} {r['replicas_pss']:12.0f} {totals[mode]:9.0f} "
              f"{statistics.median(r['first_turn_s']):22.2f}")  # fmt: skip
    ratio = statistics.mean(results["in-process"]["actor_pss"]) / statistics.mean(
        results["served"]["actor_pss"]
    )
    print(f"memory per actor, in-process / served = {ratio:.1f}x; total for "
          f"{args.sessions} sessions in-process / served = "
          f"{totals['in-process'] / totals['served']:.2f}x")  # fmt: skip
    ray_serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    sys.exit(run_main(lambda: run_stoppable(main(args))))
