"""Helpers of bench/mcp_overhead.py: statistics, what is open (server processes, TCP
connections), waiting for the HTTP server, and the printed report."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def children_running(word: str) -> int:
    """This process's children whose command line names ``word``."""
    me, found = os.getpid(), 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me and word in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found += 1
    return found


def connections_to(port: int) -> int:
    """Established TCP connections (IPv4, this machine) whose remote end is ``port``."""
    found = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            found += 1
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_listening(port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError("the HTTP MCP server did not start listening")


def stats(times: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(times) * 1e3,
        "p95_ms": percentile(times, 0.95) * 1e3,
        "n": len(times),
    }


def report(r: dict[str, Any]) -> None:
    print(
        f"MCP overhead: {r['calls']} calls per arm after warm-up, {r['blocks']} interleaved blocks"
    )
    for name in ("time", "weather"):
        s, lat = r[name], r[name]["latency"]
        print(f"\n{name} ({s['transport']})")
        labels = {
            "sdk": "SDK call_tool",
            "client": "SdkMcpClient alone",
            "gate": "through the gate",
            "lookup": "  tool+agent lookup",
            "execute": "  gate (execute)",
            "audit": "  audit write",
            "secret": "  (secret read)",
        }
        for key, label in labels.items():
            if key not in lat:
                continue
            row = lat[key]
            print(f"  {label:<18} median {row['median_ms']:7.3f} ms   p95 {row['p95_ms']:7.3f} ms")
        ratio = lat["ratio_gate_sdk"]
        verdict = "met" if ratio <= 1.2 else "missed"
        print(f"  ratio gate/SDK (medians) {ratio:.2f}x  (target ≤ 1.2x: {verdict})")
        print(f"  audit write: {lat['audit_share_of_gate']:.0%} of the gated call's median")
        ru = s["reuse"]
        print(
            f"  {ru['sessions']} concurrent sessions, {ru['calls']} calls: gate "
            f"{ru['gate_calls_per_s']:.0f} calls/s on {ru['gate_open']} {ru['counted']}; "
            f"independent SDK sessions {ru['sdk_calls_per_s']:.0f} calls/s on "
            f"{ru['sdk_open']} {ru['counted']} (opening them took {ru['sdk_open_s']:.2f} s); "
            f"the callers on one SDK session {ru['sdk_shared_calls_per_s']:.0f} calls/s on "
            f"{ru['sdk_shared_open']} {ru['counted']}"
        )
    before, after = r["loadavg_before"], r["loadavg_after"]
    print(f"\nload average before {before[0]:.2f}, after {after[0]:.2f} ({r['cpus']} CPUs)")
