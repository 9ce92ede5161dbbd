"""Run leases: one driver per run at a time, fenced by a token.

A driver takes a run's lease (``task_runs.lease_owner``, ``lease_expires_at``) before its
first step and renews it while it drives. Taking it bumps ``lease_token``, the fencing
token: every write the driver then makes for the run (a step intent, a step, the result)
runs :meth:`RunLeases.fenced` first, which locks the run row and checks that the run is
still RUNNING and the token still the driver's, in the same transaction as the write. A
driver whose lease expired and was taken by another (a stalled process, a partition)
therefore writes nothing more: its next write raises ``LeaseLost`` and rolls back.

- A lease is free when it has no owner or it expired; its owner may take it again at once
  (a run actor restarted by Ray has the same name, so the same owner).
- ``attempts`` counts the takes since the run last recorded a step: a run taken
  ``max_attempts`` times without progress ends FAILED instead of being taken again.
- Ending a run (``Store.finish_run``) clears the lease and the run's step intents in the
  same statement batch as the terminal status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from cortex_ray._exceptions import LeaseLost, NotFoundError
from cortex_ray.settings import RunPolicy
from cortex_ray.storage._database import Conn, Database

__all__ = [
    "Holding",
    "LeaseHolder",
    "OrphanedRun",
    "RunLease",
    "RunLeases",
    "exhausted_reason",
    "fenced",
]

log = logging.getLogger("cortex_ray.leases")


@dataclass(frozen=True, slots=True)
class RunLease:
    """A held lease: the run, who holds it, and the fencing token of this take."""

    org_id: str
    run_id: UUID
    owner: str
    token: int


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a run's lease now (``owner`` None: nobody), as a refused driver sees it."""

    owner: str | None
    expires_at: datetime | None
    token: int
    attempts: int
    live: bool


@dataclass(frozen=True, slots=True)
class OrphanedRun:
    """A RUNNING run that no live lease covers: nobody drives it."""

    org_id: str
    run_id: UUID
    attempts: int


_LOCK = """
SELECT status, lease_owner, lease_token, lease_expires_at, attempts,
       (lease_owner IS NOT NULL AND lease_expires_at > now()) AS live
FROM task_runs WHERE org_id = %s AND id = %s FOR UPDATE
"""

_TAKE = """
UPDATE task_runs
SET lease_owner = %s, lease_token = lease_token + 1,
    lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1
WHERE org_id = %s AND id = %s
RETURNING lease_token
"""

# Ends a run that no live lease covers (or, forced, whatever covers it); the step intents
# go with it (nobody will resume them). ``%s`` order: reason, org, run, forced.
_GIVE_UP = """
WITH ended AS (
    UPDATE task_runs
    SET status = 'FAILED', reason = %s, result = NULL, finished_at = now(),
        lease_owner = NULL, lease_expires_at = NULL
    WHERE org_id = %s AND id = %s AND status = 'RUNNING'
      AND (%s OR lease_owner IS NULL OR lease_expires_at <= now())
    RETURNING org_id, id
), intents AS (
    DELETE FROM step_intents s USING ended
    WHERE s.org_id = ended.org_id AND s.run_id = ended.id
)
SELECT count(*) AS ended FROM ended
"""

# The common case in one statement: a RUNNING run under the attempt limit whose lease is
# free, expired or the owner's own. The WHERE is evaluated again on the locked row when
# another take commits first (READ COMMITTED), so two drivers never both get it; nothing
# matched falls back to the locked read that tells why. ``%s`` order: owner, ttl, org, run,
# max_attempts, owner.
_TAKE_IF_FREE = """
UPDATE task_runs
SET lease_owner = %s, lease_token = lease_token + 1,
    lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1
WHERE org_id = %s AND id = %s AND status = 'RUNNING' AND attempts < %s
  AND (lease_owner IS NULL OR lease_expires_at <= now() OR lease_owner = %s)
RETURNING lease_token
"""

# The fence: the run row locked for the rest of the write's transaction, so a new holder's
# take waits for it (and then sees what it wrote). A step that commits is progress: the
# attempts count starts again at this (the holder's) one.
_FENCE = """
UPDATE task_runs SET attempts = CASE WHEN %s THEN 1 ELSE attempts END
WHERE org_id = %s AND id = %s AND status = 'RUNNING' AND lease_token = %s
RETURNING lease_token
"""


class Holding:
    """What a block under :meth:`RunLeases.hold` tells it: whether the run ended inside."""

    __slots__ = ("run_ended",)

    def __init__(self) -> None:
        self.run_ended = False

    def ended(self) -> None:
        """The run reached a terminal state: ``Store.finish_run`` cleared its lease in the
        same transaction, so there is nothing to release (one commit a run saved)."""
        self.run_ended = True


class RunLeases:
    """The lease SQL of ``task_runs``, and the leases this process holds (renewed by a
    heartbeat while held, released at the end and by :meth:`release_all`)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._held: dict[tuple[str, UUID], RunLease] = {}

    async def acquire(
        self, org_id: str, run_id: UUID, owner: str, policy: RunPolicy
    ) -> RunLease | None:
        """Take the run's lease for ``owner``, or ``None``: the run is not RUNNING, another
        owner's lease is live, or it was taken ``max_attempts`` times without progress (it
        is then ended FAILED, with that reason).

        Raises:
            NotFoundError: No such run in the organisation.
        """
        async with self._db.connection() as conn:  # one statement, its own commit
            cur = await conn.execute(
                _TAKE_IF_FREE,
                (owner, policy.lease_ttl_s, org_id, run_id, policy.max_attempts, owner),
            )
            taken = await cur.fetchone()
        if taken is not None:
            lease = RunLease(org_id, run_id, owner, int(taken["lease_token"]))
            self._held[(org_id, run_id)] = lease
            return lease
        async with self._db.transaction() as conn:
            cur = await conn.execute(_LOCK, (org_id, run_id))
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}")
            if row["status"] != "RUNNING":
                return None
            if row["live"] and row["lease_owner"] != owner:
                log.info(
                    "run %s: driven by %s (lease until %s); not taken by %s",
                    run_id, row["lease_owner"], row["lease_expires_at"], owner,
                )  # fmt: skip
                return None
            if row["attempts"] >= policy.max_attempts:
                reason = exhausted_reason(row["attempts"])
                await conn.execute(_GIVE_UP, (reason, org_id, run_id, True))
                log.warning("run %s FAILED: %s", run_id, reason)
                return None
            cur = await conn.execute(_TAKE, (owner, policy.lease_ttl_s, org_id, run_id))
            taken = await cur.fetchone()
            assert taken is not None  # the row is locked
        lease = RunLease(org_id, run_id, owner, int(taken["lease_token"]))
        self._held[(org_id, run_id)] = lease  # until released (release_all at the latest)
        return lease

    async def renew(self, lease: RunLease, ttl_s: float) -> bool:
        """Extend a held lease; ``False`` once it is not this holder's (or the run ended)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                """
                UPDATE task_runs SET lease_expires_at = now() + make_interval(secs => %s)
                WHERE org_id = %s AND id = %s AND lease_token = %s AND lease_owner = %s
                  AND status = 'RUNNING'
                """,
                (ttl_s, lease.org_id, lease.run_id, lease.token, lease.owner),
            )
            return cur.rowcount == 1

    async def release(self, lease: RunLease) -> None:
        """Give the lease up (if still this holder's): the run is free for the next driver
        at once, without waiting for the expiry. The token stays: it only ever grows."""
        self._forget(lease)
        async with self._db.connection() as conn:
            await conn.execute(
                """
                UPDATE task_runs SET lease_owner = NULL, lease_expires_at = NULL
                WHERE org_id = %s AND id = %s AND lease_token = %s AND lease_owner = %s
                """,
                (lease.org_id, lease.run_id, lease.token, lease.owner),
            )

    async def release_all(self) -> None:
        """Release every lease this process still holds (``Runtime.close``)."""
        for lease in list(self._held.values()):
            try:
                await self.release(lease)
            except Exception as exc:  # closing: the lease expires on its own
                log.warning("run %s: releasing its lease failed: %s", lease.run_id, exc)

    def _forget(self, lease: RunLease) -> None:
        key = (lease.org_id, lease.run_id)
        if self._held.get(key) == lease:
            del self._held[key]

    @contextlib.asynccontextmanager
    async def hold(self, lease: RunLease, policy: RunPolicy) -> AsyncIterator[Holding]:
        """Keep ``lease`` renewed while the block runs; release it when the block ends
        (however it ends: a crash of the process leaves it to expire), unless the block
        said :meth:`Holding.ended` (the run's terminal write cleared the lease already)."""
        holding = Holding()
        beat = asyncio.create_task(self._heartbeat(lease, policy), name=f"lease {lease.run_id}")
        try:
            yield holding
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            if holding.run_ended:
                self._forget(lease)
            else:
                try:
                    await self.release(lease)
                except Exception as exc:  # it expires on its own
                    log.warning("run %s: releasing its lease failed: %s", lease.run_id, exc)

    async def _heartbeat(self, lease: RunLease, policy: RunPolicy) -> None:
        while True:
            await asyncio.sleep(policy.lease_renew_s)
            try:
                if not await self.renew(lease, policy.lease_ttl_s):
                    # Taken over or ended: the driver finds out at its next write.
                    log.info("run %s: the lease of %s is gone", lease.run_id, lease.owner)
                    return
            except Exception as exc:  # the database away for a moment: try again
                log.warning("run %s: renewing the lease failed: %s", lease.run_id, exc)

    def fenced(self, lease: RunLease, *, progress: bool = False) -> AsyncContextManager[Conn]:
        """:func:`fenced` on this database."""
        return fenced(self._db, lease, progress=progress)

    async def holder(self, org_id: str, run_id: UUID) -> LeaseHolder:
        """Who holds the run's lease now.

        Raises:
            NotFoundError: No such run in the organisation.
        """
        async with self._db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT lease_owner, lease_token, lease_expires_at, attempts,
                       (lease_owner IS NOT NULL AND lease_expires_at > now()) AS live
                FROM task_runs WHERE org_id = %s AND id = %s
                """,
                (org_id, run_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}")
        return LeaseHolder(
            owner=row["lease_owner"],
            expires_at=row["lease_expires_at"],
            token=int(row["lease_token"]),
            attempts=int(row["attempts"]),
            live=bool(row["live"]),
        )

    async def orphaned(self, grace_s: float, limit: int = 1000) -> list[OrphanedRun]:
        """RUNNING runs of every organisation with no live lease, created more than
        ``grace_s`` ago (a run just submitted is about to be taken by its executor), oldest
        first."""
        async with self._db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT org_id, id, attempts FROM task_runs
                WHERE status = 'RUNNING'
                  AND (lease_owner IS NULL OR lease_expires_at <= now())
                  AND created_at <= now() - make_interval(secs => %s)
                ORDER BY created_at LIMIT %s
                """,
                (grace_s, limit),
            )
            rows = await cur.fetchall()
        return [OrphanedRun(r["org_id"], r["id"], int(r["attempts"])) for r in rows]

    async def give_up(self, org_id: str, run_id: UUID, reason: str) -> bool:
        """End a RUNNING run FAILED with ``reason`` if no live lease covers it (a driver
        that took it meanwhile keeps it); ``True`` when it was ended here."""
        async with self._db.transaction() as conn:
            cur = await conn.execute(_GIVE_UP, (reason, org_id, run_id, False))
            row = await cur.fetchone()
        return bool(row and row["ended"])


@contextlib.asynccontextmanager
async def fenced(db: Database, lease: RunLease, *, progress: bool = False) -> AsyncIterator[Conn]:
    """A transaction that writes for the run only while ``lease`` holds: the run row is
    locked and checked first (RUNNING, this token), and the statements of the block are
    pipelined with it: BEGIN and the check in one round trip, the block's statements and
    COMMIT in another. ``progress``: the write records a step (attempts start again).

    Raises:
        LeaseLost: The run ended or another driver took it; nothing is written.
    """
    async with db.connection() as conn, conn.pipeline(), conn.transaction():
        cur = await conn.execute(_FENCE, (progress, lease.org_id, lease.run_id, lease.token))
        if await cur.fetchone() is None:
            raise LeaseLost(
                f"run {lease.run_id}: the lease of {lease.owner} (token {lease.token}) was "
                "taken over, or the run ended"
            )
        yield conn


def exhausted_reason(attempts: int) -> str:
    """Why a run that kept failing to make progress was ended."""
    return (
        f"gave up after {attempts} attempts to drive the run without recording a step "
        "(runs.max_attempts); see the server log for what stopped each attempt"
    )
