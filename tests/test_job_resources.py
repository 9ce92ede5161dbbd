"""What a job's Ray tasks ask beside others (``jobs._resources``), without a cluster; the
jobs on a real Ray with CPUs held by another actor: tests/test_ingest_job.py."""

from __future__ import annotations

import io

import pytest

from jobs._resources import ResourceWatch, fit_tasks

pytestmark = pytest.mark.unit


def test_a_job_asks_a_whole_cpu_a_task_where_every_stage_has_one() -> None:
    assert (fit_tasks(2, 2, stages=2).num_cpus, fit_tasks(2, 2, stages=2).concurrency) == (1, None)
    assert not fit_tasks(8, 8, stages=1).fitted


def test_beside_the_local_stack_each_stage_gets_a_share_of_what_is_free() -> None:
    """The stack on 2 CPUs reserves 1.5: two stages ask 0.25 each, one task at a time."""
    fit = fit_tasks(0.5, 2, stages=2)
    assert (fit.num_cpus, fit.concurrency, fit.fitted) == (0.25, 1, True)
    assert fit.describe().startswith("0.25 CPU each, 1 at a time (0.5 of 2 CPUs free")
    assert fit_tasks(1.5, 2, stages=2).num_cpus == 0.75
    assert fit_tasks(0.5, 2, stages=1).num_cpus == 0.5


def test_with_nothing_free_a_task_asks_a_cpu_and_the_watch_says_so() -> None:
    fit = fit_tasks(0, 2, stages=2)
    assert (fit.num_cpus, fit.fitted) == (1, False)  # the demand a scaling cluster sees
    out = io.StringIO()
    watch = ResourceWatch(
        "ingest", fit.num_cpus, available=lambda: 0.0, total=lambda: 2.0, after_s=0, out=out
    )
    line = watch.check()
    assert line is not None and line.startswith("ingest: no result for 0 s, waiting for")
    assert "each task asks 1 CPU and the cluster has 0 of 2 CPUs free" in line
    assert watch.check() is None  # said again only after every_s


def test_the_watch_is_quiet_while_a_task_fits_or_results_come() -> None:
    fits = ResourceWatch("ingest", 0.25, available=lambda: 0.5, total=lambda: 2.0, after_s=0)
    assert fits.check() is None
    busy = ResourceWatch("ingest", 1, available=lambda: 0.0, total=lambda: 2.0, after_s=5)
    busy.progressed()
    assert busy.check() is None and busy.after_s == busy.every_s
