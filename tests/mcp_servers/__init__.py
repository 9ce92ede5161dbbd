"""MCP servers the tests start (real servers on the official SDK), and how a test starts the
streamable-HTTP one: ``HttpServer(free_port(), state_dir, token).start()``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cortex_ray.mcp import McpServerConfig, McpTransport

__all__ = ["SERVERS", "HttpServer", "free_port", "listening", "wait_for"]

SERVERS = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], object], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class HttpServer:
    """``http_server.py`` in a process of its own, behind ``Authorization: Bearer <token>``."""

    port: int
    state: Path
    token: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVERS / "http_server.py"), str(self.port), self.token,
             str(self.state)]
        )  # fmt: skip
        wait_for(lambda: listening(self.port), "the HTTP MCP server to listen")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def config(self) -> McpServerConfig:
        return McpServerConfig(transport=McpTransport.HTTP, url=self.url)
