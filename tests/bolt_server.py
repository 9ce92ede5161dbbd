"""A real Bolt server for the tests: ArcadeDB (``arcadedb-embedded``, bundled JRE) with its
Bolt plugin, in a process of its own, reached with the official ``neo4j`` driver.

``python tests/bolt_server.py ROOT PORT PASSWORD`` starts it (heap 512 MB, two processors,
docs/graph.md "Testing"), writes ``ROOT/READY`` and serves until its stdin closes.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "cortex-test-password"


@dataclass(frozen=True)
class BoltServer:
    uri: str
    user: str
    password: str
    database: str = "graph"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def bolt_server(start_timeout_s: float = 120.0) -> Iterator[BoltServer]:
    """Start the server, yield how to reach it, stop it (also when the tests fail)."""
    root = Path(tempfile.mkdtemp(prefix="cortex-bolt-", dir="/tmp"))
    port = _free_port()
    log = root / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, str(root / "db"), str(port), PASSWORD],
            stdin=subprocess.PIPE,
            stdout=out,
            cwd=root,  # its log/ folder goes there
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not (root / "db" / "READY").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ArcadeDB did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield BoltServer(uri=f"bolt://127.0.0.1:{port}", user="root", password=PASSWORD)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _serve(root: str, port: int, password: str) -> None:
    from arcadedb_embedded.jvm import start_jvm

    # The machine is shared: a small heap, two processors, the serial collector.
    start_jvm(heap_size="512m", jvm_args="-XX:+UseSerialGC -XX:ActiveProcessorCount=2")
    import arcadedb_embedded

    server = arcadedb_embedded.create_server(
        root_path=root,
        root_password=password,
        config={
            "server_plugins": "Bolt:com.arcadedb.bolt.BoltProtocolPlugin",
            "bolt_port": port,
            "bolt_defaultDatabase": "graph",
            "http_port": _free_port(),
        },
    )
    server.start()
    server.create_database("graph")
    (Path(root) / "READY").touch()
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), sys.argv[3])
