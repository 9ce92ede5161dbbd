"""What a job's Ray tasks ask for, and saying what they wait for.

On the embedded default a job joins the local stack's Ray (``python -m serve``, the demo),
whose replicas reserve CPUs (the API 0.5, each served model 0.5: 1.5 of a 2-CPU machine).
Ray Data's tasks ask one CPU each by default: beside the stack none could ever start, and
the job waited without a word (``ray status`` showed the pending demand). So the job's
task stages ask, between them, at most what the cluster has free when it starts
(:func:`fit_tasks`), and a :class:`ResourceWatch` says within seconds when they still wait:
what a task asks against what is free.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["ResourceWatch", "TaskFit", "fit_tasks"]


@dataclass(frozen=True)
class TaskFit:
    """The Ray resources each task of a job's stage asks, and how many run at once."""

    num_cpus: float
    """CPUs each task asks (Ray's logical CPUs: a reservation, not a limit)."""
    concurrency: int | None
    """Tasks of one stage at once; ``None``: Ray Data's own choice."""
    free_cpus: float
    total_cpus: float

    @property
    def fitted(self) -> bool:
        """The tasks ask less than Ray's default (a whole CPU) to fit beside others."""
        return self.num_cpus < 1

    def describe(self) -> str:
        each = f"{self.num_cpus:g} CPU each"
        at_once = f", {self.concurrency} at a time" if self.concurrency else ""
        return (
            f"{each}{at_once} ({self.free_cpus:g} of {self.total_cpus:g} CPUs free: "
            "the rest is reserved by other actors and tasks)"
        )


def fit_tasks(free_cpus: float, total_cpus: float, stages: int) -> TaskFit:
    """What each task of ``stages`` task stages (running side by side, streaming) asks so
    that they fit in ``free_cpus``.

    A whole CPU each where every stage can have one (Ray Data's default, concurrency its
    own). With less free, but some, each stage gets an equal share of what is free and one
    task at a time: a stage alone holding the free share could block on its output while
    the next stage, which would drain it, could not start. With nothing free, the default
    (a cluster that scales up sees the demand; :class:`ResourceWatch` says what waits).
    """
    stages = max(stages, 1)
    if free_cpus >= stages or free_cpus <= 0:
        return TaskFit(1.0, None, free_cpus, total_cpus)
    share = math.floor(free_cpus / stages * 100) / 100  # never above what is free
    if share <= 0:
        return TaskFit(1.0, None, free_cpus, total_cpus)
    return TaskFit(share, 1, free_cpus, total_cpus)


class ResourceWatch:
    """A daemon thread that says, on ``out``, when no result has come for ``after_s`` and
    the cluster has less free than a task asks: what a task asks, what is free, where to
    look. Said again every ``every_s`` while it lasts. ``progressed()`` marks a result."""

    def __init__(
        self,
        job: str,
        ask_cpus: float,
        *,
        available: Any = None,
        total: Any = None,
        after_s: float = 5.0,
        every_s: float = 30.0,
        out: TextIO | None = None,
    ) -> None:
        self.job = job
        self.ask_cpus = ask_cpus
        self._available = available or _available_cpus
        self._total = total or _total_cpus
        self.after_s = after_s
        self.every_s = every_s
        self._out = out
        self._last = time.monotonic()
        self._said = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{job} watch", daemon=True)
        self.said: list[str] = []

    def __enter__(self) -> ResourceWatch:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def progressed(self) -> None:
        self._last = time.monotonic()
        # Results came, so its tasks started: a later pause is more likely a big file than
        # a wait for CPUs (which this job's own running tasks hold too): said only if long.
        self.after_s = max(self.after_s, self.every_s)

    def check(self) -> str | None:
        """The line to say now, or ``None`` (results come, or a task fits and is just
        slow)."""
        now = time.monotonic()
        if now - self._last < self.after_s or now - self._said < self.every_s:
            return None
        free = self._available()
        if free >= self.ask_cpus:
            return None
        self._said = now
        return (
            f"{self.job}: no result for {now - self._last:.0f} s, waiting for resources: each "
            f"task asks {self.ask_cpus:g} CPU and the cluster has {free:g} of "
            f"{self._total():g} CPUs free (the rest is reserved by other actors and tasks; "
            "`ray status` lists the demand). It goes on when CPUs are freed or added"
        )

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                line = self.check()
            except Exception:  # Ray going away under the job: the job reports that
                return
            if line is not None:
                self.said.append(line)
                out = self._out or sys.stderr
                out.write(line + "\n")
                out.flush()


def _available_cpus() -> float:
    import ray

    return float(ray.available_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]


def _total_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
