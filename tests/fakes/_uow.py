"""The fake unit of work: a transaction's writes apply on commit, vanish on an error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

__all__ = ["FakeDatabase", "FakeTransaction"]


class FakeTransaction:
    """The handle of one fake transaction: writes wait here until it commits."""

    def __init__(self) -> None:
        self._writes: list[Callable[[], None]] = []
        self.open = True

    def on_commit(self, write: Callable[[], None]) -> None:
        if not self.open:
            raise RuntimeError("this transaction has ended")
        self._writes.append(write)

    def _commit(self) -> None:
        self.open = False
        for write in self._writes:
            write()


class FakeDatabase:
    """The unit of work (``UnitOfWork[FakeTransaction]``): commit on success, roll back on
    an error; counts both so a test can say what happened."""

    def __init__(self) -> None:
        self.commits = 0
        self.rollbacks = 0

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[FakeTransaction]:
        tx = FakeTransaction()
        try:
            yield tx
        except BaseException:
            tx.open = False
            self.rollbacks += 1
            raise
        tx._commit()
        self.commits += 1
