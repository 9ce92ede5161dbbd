"""How a local stack's Ray is found by the other entry points on the same machine.

The demo and ``python -m serve`` start a Ray of their own (``ray.init()``, not ``ray
start``), which Ray's own discovery (``/tmp/ray/ray_current_cluster``) does not list. They
write its GCS address into ``<data dir>/ray-address`` while they run (removed when they
stop), and ``cortex-ray ingest`` (``python -m jobs.ingest``) joins that Ray instead of
starting a second one: its tasks then show in the same Ray dashboard, beside the stack's
actors.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

__all__ = ["LOCAL_RAY_FILE", "announce_local_ray", "local_ray_address"]

LOCAL_RAY_FILE = "ray-address"


def announce_local_ray(data_dir: Path, gcs_address: str) -> Path:
    """Say where this machine's stack's Ray is (the caller removes the file when it stops)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCAL_RAY_FILE
    path.write_text(gcs_address + "\n")
    return path


def local_ray_address(data_dir: Path) -> str | None:
    """The running local stack's Ray (``host:port`` of its GCS), or ``None``: no stack runs
    (no file), or the one that wrote it is gone (nothing answers on that port)."""
    path = data_dir / LOCAL_RAY_FILE
    try:
        address = path.read_text().strip()
    except OSError:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
        return address
    return None
