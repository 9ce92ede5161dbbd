"""Gate overhead of governance (issue 18, point 9): one tool call through the invocation
gate with connector grants, the governed audit row and redaction on, against the bare gate.

BARE      ``ToolDispatcher.invoke`` of a READ tool of no connector: schema check, the
          agent's tool grant, the handler, output bound, the audit row (its own transaction;
          decision, tier and hashes included, as every row has them now).
GOVERNED  the same tool belonging to a connector: the gate also reads the organisation's
          instance and the principal's grants (one statement, or the process's copy of the
          last ``grant_cache_s`` seconds: the default, 1 s), checks the grant (tools, tier,
          an ``enum`` argument constraint, expiry, approval policy), redacts two sensitive
          result fields, and the audit row records the grant and the source ids.
UNCACHED  GOVERNED with ``grant_cache_s=0``: the grants read on every call.

Both gates run in one process on one embedded PostgreSQL, warmed first, interleaved in
blocks (the order alternating) so drift cancels. Printed: median and p95 microseconds per
call and the ratios GOVERNED/BARE and UNCACHED/BARE of the medians (target ≤ 1.2×, for the
default: GOVERNED).

Run: ``.venv/bin/python bench/gate_overhead.py [--calls 2000] [--blocks 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cortex_ray import Agent, AgentMode, CapabilityTier, Grant, ObservationStatus, Settings
from cortex_ray.access import AccessControlService
from cortex_ray.act import InvocationContext, Tool, ToolContext, ToolDispatcher, ToolRegistry
from cortex_ray.governance import (
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    ConnectorPolicy,
    GovernanceStore,
)
from cortex_ray.storage import Database, Store

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "region": {"type": "string"}},
    "required": ["name", "region"],
    "additionalProperties": False,
}


async def lookup(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "customer": args["name"],
        "email": "ann@example.com",
        "card": {"last4": "1111", "ssn": "078-05-1120"},
        "hits": [{"source_id": f"crm:{i}", "text": "a line of notes " * 4} for i in range(5)],
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int, blocks: int) -> int:
    data = Path(tempfile.mkdtemp(prefix="cortex-ray-gate-bench-", dir="/tmp"))
    settings = Settings(data_dir=data)
    db = await Database.open(settings.storage)
    try:
        store = Store(db)
        gov = GovernanceStore(db)
        org = f"bench-{uuid.uuid4().hex[:8]}"
        await store.ensure_org(org)
        bare_tool = Tool(
            name="lookup", description="", handler=lookup, parameters=SCHEMA,
            tier=CapabilityTier.READ,
        )  # fmt: skip
        governed_tool = Tool(
            name="lookup", description="", handler=lookup, parameters=SCHEMA,
            tier=CapabilityTier.READ, connector="crm",
        )  # fmt: skip
        crm = Connector(name="crm", sensitive_fields=("email", "ssn"))
        bare = ToolDispatcher(
            ToolRegistry([bare_tool]), AccessControlService(), store, settings.tools
        )
        gates = {"bare": bare}
        for name, cache_s in (("governed", settings.governance.grant_cache_s), ("uncached", 0.0)):
            gates[name] = ToolDispatcher(
                ToolRegistry([governed_tool]),
                AccessControlService(),
                store,
                settings.tools,
                governance=ConnectorPolicy(gov, [crm], cache_s=cache_s),
            )
        agent = Agent(
            org_id=org, name="bench", mode=AgentMode.AUTONOMOUS, tools=("lookup",),
            grant=Grant(tools=frozenset({"lookup"})),
        )  # fmt: skip
        await gov.put_instance(ConnectorInstance(org_id=org, connector="crm"))
        await gov.create_grant(
            ConnectorGrant(
                org_id=org,
                principal_id=agent.principal().id,
                connector="crm",
                tools=("lookup",),
                constraints={"region": {"enum": ["eu", "uk"]}},
            )
        )
        ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
        args = {"name": "ann", "region": "eu"}
        per_block = max(1, calls // blocks)

        async def block(gate: ToolDispatcher) -> list[float]:
            times = []
            for _ in range(per_block):
                started = time.perf_counter()
                obs = await gate.invoke(ctx, "lookup", args)
                times.append(time.perf_counter() - started)
                assert obs.status is ObservationStatus.OK, obs.summary
            return times

        # Warm both (connections, validators, the grant's constraint), check redaction.
        for gate in [*gates.values(), *gates.values()]:
            await block(gate)
        for name in ("governed", "uncached"):
            out = (await gates[name].invoke(ctx, "lookup", args)).output
            assert out["email"] == "[REDACTED]" and out["card"]["ssn"] == "[REDACTED]"
        timings: dict[str, list[float]] = {name: [] for name in gates}
        order = list(gates.items())
        for i in range(blocks):
            for name, gate in order[i % 3 :] + order[: i % 3]:
                timings[name] += await block(gate)
        med = {k: statistics.median(v) * 1e6 for k, v in timings.items()}
        p95 = {k: percentile(v, 0.95) * 1e6 for k, v in timings.items()}
        n = len(timings["bare"])
        print(f"gate overhead: {n} calls each, {blocks} interleaved blocks, one process")
        for k in gates:
            print(f"  {k:<9} median {med[k]:8.1f} µs   p95 {p95[k]:8.1f} µs")
        for k in ("governed", "uncached"):
            ratio = med[k] / med["bare"]
            verdict = "met" if ratio <= 1.2 else "missed"
            print(f"  ratio {k}/bare (medians) {ratio:.2f}x  (target ≤ 1.2x: {verdict})")
        return 0
    finally:
        await db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=20)
    ns = parser.parse_args()
    sys.exit(asyncio.run(main(ns.calls, ns.blocks)))
