"""Context graph extraction cost in the ingestion job (issue 19, point 6): the same corpus
ingested by ``jobs.ingest.run_ingest`` (lexical tier, ``embed=False``) without and with the
graph stage, alternating, each run into a new collection (every file new), on one local Ray;
reports MB/s of each, the extraction's extra seconds per MB and the assertions per MB.

Run: ``.venv/bin/python bench/graph_extraction_cost.py DIR [--rounds 2] [--cpus 2]``
(e.g. the Linux kernel's Documentation/admin-guide, docs/ingestion.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scratch import scratch_data_dir

from cortex_ray import reclaim_signals, run_main
from cortex_ray.storage import EmbeddedPostgres, migrate

MB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    from jobs.ingest import run_ingest

    with scratch_data_dir(args.data_dir) as data_dir:
        pg = EmbeddedPostgres(data_dir / "pg")
        try:
            migrate(pg.dsn)
            os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 (Ray reads this name)
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
            reclaim_signals()
            times: dict[bool, list[float]] = {False: [], True: []}
            size = 0
            assertions = 0
            try:
                for r in range(args.rounds):
                    for graph in (False, True):
                        name = f"{'graph' if graph else 'plain'}-{uuid.uuid4().hex[:6]}"
                        report = run_ingest("bench", name, [args.corpus], dsn=pg.dsn,
                                            embed=False, graph=graph)  # fmt: skip
                        size = report.bytes_read
                        times[graph].append(report.seconds)
                        if graph and report.graph:
                            assertions = report.graph["assertions"]
                        print(f"round {r + 1} {'with' if graph else 'without'} graph: "
                              f"{report.seconds:.1f} s, {size / MB / report.seconds:.2f} MB/s"
                              + (f", {report.graph}" if graph else ""), flush=True)  # fmt: skip
            finally:
                ray.shutdown()
        finally:
            pg.stop()
    plain, with_graph = statistics.mean(times[False]), statistics.mean(times[True])
    print(json.dumps({
        "corpus": str(args.corpus), "mb": round(size / MB, 2), "cpus": args.cpus,
        "plain_s": [round(t, 1) for t in times[False]],
        "graph_s": [round(t, 1) for t in times[True]],
        "plain_mb_per_s": round(size / MB / plain, 2),
        "graph_mb_per_s": round(size / MB / with_graph, 2),
        "extraction_s_per_mb": round((with_graph - plain) / (size / MB), 3),
        "assertions": assertions, "assertions_per_mb": round(assertions / (size / MB)),
        "load_average_end": round(os.getloadavg()[0], 1),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
