"""Starting and stopping the Ray side of an entry point: one way for the demo, ``python -m
serve`` and ``python -m serve.models`` (the benchmarks, plain scripts, use the core's
``run_main`` and ``reclaim_signals`` directly).

:func:`ray_driver` connects to ``RAY_ADDRESS`` (or starts a local Ray), then installs the
core's SIGINT and SIGTERM handling (``cortex_ray.stop_on_signals``) *after* ``ray.init``, which
replaces SIGTERM's handler with one that only exits. On the way out, normally or on the first
signal, it runs what the entry point registered with :meth:`RayDriver.callback` (deleting its
Serve apps, which closes the replicas' runtimes; stopping the embedded PostgreSQL it started)
in reverse order, each step even if an earlier one failed, and then calls ``ray.shutdown()``:
a Ray this process started stops (with Serve's controller and proxies), one it connected to
is only disconnected from. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

import ray

from actors import announce_local_ray
from cortex_ray import Interrupted, SignalGuard, stop_on_signals

__all__ = ["Interrupted", "RayDriver", "plain_output", "ray_driver"]

log = logging.getLogger("serve.lifecycle")


class RayDriver:
    """The running entry point: what to undo when it stops, and how to wait for a signal."""

    def __init__(
        self, guard: SignalGuard, stack: ExitStack, dashboard_url: str | None = None
    ) -> None:
        self.guard = guard
        self._stack = stack
        self.dashboard_url = dashboard_url
        """The Ray dashboard of a Ray this entry point started (``None``: none, or not ours)."""

    def callback(self, stop: Callable[[], Any]) -> None:
        """Call ``stop()`` on the way out (last registered, first called)."""
        self._stack.callback(_quietly, stop)

    @staticmethod
    def wait() -> None:
        """Block until SIGINT or SIGTERM (which raise :class:`Interrupted` here)."""
        while True:
            time.sleep(3600)


def _quietly(stop: Callable[[], Any]) -> None:
    """One clean-up step: a failure is logged and the next step still runs; a first signal
    during the clean-up is let through only after the remaining steps (ExitStack re-raises)."""
    try:
        stop()
    except Exception:
        log.exception("clean-up step %s failed", getattr(stop, "__qualname__", stop))


def _shutdown_ray() -> None:
    # The apps were deleted (gracefully) by the callbacks; a Ray this process started takes
    # Serve's controller and proxies with it (serve.shutdown first only adds a retried-task
    # warning), and one it connected to keeps its Serve for others.
    ray.shutdown()


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
"""An ANSI control sequence (colours, bold, cursor moves): ESC [ parameters final-byte."""


class _PlainStream:
    """A text stream that drops ANSI control sequences on their way to ``stream``; every
    other attribute is the stream's own (``fileno``, ``isatty``, ``encoding``, ...)."""

    def __init__(self, stream: TextIO) -> None:
        self.plain = stream

    def write(self, text: str) -> int:
        self.plain.write(_ANSI.sub("", text))
        return len(text)

    def flush(self) -> None:
        self.plain.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plain, name)


def plain_output() -> None:
    """Clean lines on stdout and stderr where they are not a terminal (a log file, a pipe,
    ``systemd``, ``docker logs``): what Ray prints in the driver has no colour codes and is
    not deduplicated.

    Ray 2.60's own switches, where they exist: ``RAY_COLOR_PREFIX=0`` (read at each line)
    leaves the ``(ServeReplica:… pid=…)`` prefixes of the workers' lines uncoloured;
    ``RAY_DEDUP_LOGS=0`` stops the ``[repeated Nx across cluster]`` summaries and their hint,
    but Ray reads it once, when it is imported, which ``python -m serve`` has done before
    ``main`` runs (the ``serve`` package imports Ray), so the value it read is set too. Some
    colour has no switch (``ray.init``'s dashboard line, the deduplicator's green): the
    streams drop every ANSI sequence. A variable the user set is left as it is; on a
    terminal nothing changes."""
    if sys.stdout.isatty() and sys.stderr.isatty():
        return
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if "RAY_DEDUP_LOGS" not in os.environ:
        os.environ["RAY_DEDUP_LOGS"] = "0"  # the workers and any later import
        try:  # the constant Ray's deduplicator reads; no public API sets it
            import ray._private.ray_logging as ray_logging

            ray_logging.RAY_DEDUP_LOGS = False  # type: ignore[attr-defined]
        except (ImportError, AttributeError):  # another Ray: the variable is what we have
            pass
    if not sys.stdout.isatty() and not isinstance(sys.stdout, _PlainStream):
        sys.stdout = _rewired(sys.stdout, _PlainStream(sys.stdout))
    if not sys.stderr.isatty() and not isinstance(sys.stderr, _PlainStream):
        sys.stderr = _rewired(sys.stderr, _PlainStream(sys.stderr))


def _rewired(old: TextIO, plain: _PlainStream) -> Any:
    """``plain``, after pointing the log handlers that write to ``old`` at it: Ray's own
    handler took ``sys.stderr`` when Ray was imported, before this could wrap it."""
    loggers = [logging.getLogger(), *logging.root.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                # (a handler whose stream is a property, sys.stderr at each line, is fine)
                with contextlib.suppress(AttributeError):
                    handler.setStream(plain)
    return plain


@contextmanager
def ray_driver(*, announce: Path | None = None, **init_kwargs: Any) -> Iterator[RayDriver]:
    """Ray for an entry point, and its clean stop on SIGINT, SIGTERM or leaving the block.

    ``init_kwargs`` go to ``ray.init`` when this process is not connected yet (with
    ``RAY_ADDRESS`` set it connects there, otherwise it starts a local Ray, with its dashboard
    on 127.0.0.1 unless ``include_dashboard=False``: the Ray dashboard and ``ray list
    actors`` then work). A Ray this block did not initialise is left alone. With
    ``announce`` (a data dir), a Ray it started is announced there for the other entry points
    of this machine while it runs (``actors.announce_local_ray``). :class:`Interrupted`
    propagates out of the block after the clean-up: the caller picks the exit code
    (``exc.exit_code`` or 0). Where stdout or stderr is not a terminal, the output is made
    plain first (:func:`plain_output`).
    """
    plain_output()
    with stop_on_signals() as guard, ExitStack() as stack:
        dashboard: str | None = None
        if not ray.is_initialized():
            init_kwargs.setdefault("include_dashboard", True)
            if init_kwargs["include_dashboard"]:
                init_kwargs.setdefault("dashboard_host", "127.0.0.1")
            context = ray.init(**init_kwargs)
            stack.callback(_shutdown_ray)
            # ray.init installed its own SIGTERM handlers (Python's, and the core worker's
            # C++ one, which aborts): take both signals back.
            guard.install()
            if context.dashboard_url:
                dashboard = f"http://{context.dashboard_url}"
                log.info("Ray dashboard on %s", dashboard)
            if announce is not None:
                written = announce_local_ray(announce, ray.get_runtime_context().gcs_address)
                stack.callback(written.unlink, missing_ok=True)
        yield RayDriver(guard, stack, dashboard)
