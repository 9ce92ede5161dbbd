"""Stopping on SIGINT and SIGTERM: one behaviour for every entry point.

The first SIGINT or SIGTERM unwinds the program: a synchronous entry point gets
:class:`Interrupted` (a ``KeyboardInterrupt``) raised in its main thread, an asynchronous
one (:func:`run_stoppable`) has its main task cancelled, so ``finally`` blocks and context
managers close what was opened (runtimes, the embedded PostgreSQL, Serve apps, Ray). A
second signal exits at once with ``128 + signum``, for whoever cannot wait for that clean-up
(the same signal again within a second counts as the first: ``timeout`` sends it twice).

Both handlers are installed explicitly, because neither default holds everywhere: a
background job of a non-interactive shell (``cmd &``, many service managers) starts with
SIGINT ignored, so Python installs no ``KeyboardInterrupt`` for it; SIGTERM's default kills
the process without running any clean-up; and ``ray.init`` replaces SIGTERM's handler with
its own (call :meth:`SignalGuard.install` again after it).

Exit codes (see docs/operations.md, "Stopping"): a command interrupted before it finished
exits ``128 + signum`` (130 for SIGINT, 143 for SIGTERM; :attr:`Interrupted.exit_code`); a
server, whose normal way to stop is a signal, exits 0 once it has cleaned up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType
from typing import Any, TypeVar

__all__ = [
    "SIGNALS",
    "Interrupted",
    "SignalGuard",
    "reclaim_signals",
    "run_main",
    "run_stoppable",
    "stop_on_signals",
]

T = TypeVar("T")

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop an entry point."""

REPEAT_WINDOW_S = 1.0
"""The same signal again within this many seconds of the first is not a second request."""

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived: raised in the main thread (or after :func:`run_stoppable`'s main task
    was cancelled). A ``KeyboardInterrupt``, so code that already stops on Ctrl-C stops on
    SIGTERM as well."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by this signal: ``128 + signum``."""
        return 128 + self.signum


def _exit_now(signum: int) -> None:
    """The second signal: no more clean-up, exit with ``128 + signum``."""
    os.write(2, f"\n{signal.Signals(signum).name} again: exiting without clean-up\n".encode())
    os._exit(128 + signum)


class SignalGuard:
    """SIGINT and SIGTERM handlers of this process while it runs one entry point.

    ``received`` is the first signal that arrived (``None`` until then). Install in the
    main thread; :meth:`restore` puts the previous handlers back."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._received_at = 0.0
        self._previous: dict[signal.Signals, _Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def install(self) -> None:
        """Handle both signals here; call again after code that replaced a handler
        (``ray.init``). Inside :func:`run_stoppable`, through the event loop (cancelling its
        task)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if self._loop is not None:
                self._loop.add_signal_handler(signum, self._on_loop_signal, signum)
            else:
                signal.signal(signum, self._on_signal)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def note(self, signum: int) -> bool:
        """Record a signal: ``True`` for the first, which stops the entry point. A later one
        exits the process at once, except the same signal again within
        :data:`REPEAT_WINDOW_S`: the same request delivered twice (``timeout`` signals its
        child and then the child's process group), ignored."""
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signum, now
            return True
        if signum == self.received and now - self._received_at < REPEAT_WINDOW_S:
            return False
        _exit_now(signum)
        return False  # not reached

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.note(signum):
            raise Interrupted(signum)

    def _on_loop_signal(self, signum: int) -> None:
        if self.note(signum) and self._task is not None:
            self._task.cancel()

    def _attach(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self._loop, self._task = loop, task
        self.install()

    def _detach(self) -> None:
        loop, self._loop, self._task = self._loop, None, None
        if loop is not None and threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                loop.remove_signal_handler(signum)
            # remove_signal_handler put the defaults back; the loop's teardown (remaining
            # tasks, executor threads) still stops on a signal.
            self.install()


_active: list[SignalGuard] = []


def reclaim_signals() -> None:
    """Take SIGINT and SIGTERM back for the innermost :func:`stop_on_signals` or
    :func:`run_stoppable`: for code that called ``ray.init`` inside one (it installs SIGTERM
    handlers of its own, the core worker's C++ one aborting the process)."""
    if _active:
        _active[-1].install()


@contextmanager
def stop_on_signals() -> Iterator[SignalGuard]:
    """Within the block, the first SIGINT or SIGTERM raises :class:`Interrupted` in the main
    thread and a second exits at once; outside, the previous handlers apply again.

    In a thread other than the main one (where no handler can be installed) it does nothing.
    """
    guard = SignalGuard()
    guard.install()
    _active.append(guard)
    try:
        yield guard
    finally:
        _active.remove(guard)
        guard.restore()


def run_stoppable(main: Coroutine[Any, Any, T], *, guard: SignalGuard | None = None) -> T:
    """``asyncio.run(main)`` that stops on SIGINT and SIGTERM.

    The first signal cancels ``main`` (its ``finally`` blocks and ``async with`` exits run,
    so an open ``Runtime`` closes and stops the embedded PostgreSQL it started); once it has
    unwound, :class:`Interrupted` is raised. A second signal exits at once.

    ``guard``: the entry point's own :class:`SignalGuard` (default: the innermost active
    :func:`stop_on_signals`), so that a signal before, during and after this call counts
    once; with none active, one is installed for the call and the previous handlers are
    restored afterwards.
    """
    with ExitStack() as stack:
        if guard is None:
            guard = _active[-1] if _active else stack.enter_context(stop_on_signals())
        return _run_guarded(main, guard)


def run_main(main: Callable[[], int | None]) -> int:
    """A script's ``main()`` under :func:`stop_on_signals`: its exit code, or ``128 + signum``
    once a signal has unwound it (``sys.exit(run_main(main))``). Unwinding runs its
    ``finally`` blocks and, as the interpreter then exits normally, the exit handlers (the
    embedded PostgreSQL's, Ray's ``shutdown``) that a killed process would skip."""
    with stop_on_signals():
        try:
            return main() or 0
        except Interrupted as exc:
            os.write(2, f"\n{exc}: stopped\n".encode())
            return exc.exit_code


def _run_guarded(main: Coroutine[Any, Any, T], guard: SignalGuard) -> T:
    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        guard._attach(asyncio.get_running_loop(), task)
        try:
            return await main
        finally:
            guard._detach()

    try:
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        if guard.received is not None:
            raise Interrupted(guard.received) from None
        raise
    if guard.received is not None:
        raise Interrupted(guard.received)
    return result
