"""``NoDriver``: the run driver of use-case tests that drive no run."""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from cortex_ray._types import Agent, TaskRun
from cortex_ray.cycle import StepCallback
from cortex_ray.runtime._runs import LeaseReader

__all__ = ["NoDriver"]


class NoDriver:
    """A ``RunDriver`` (what ``RunUseCases`` asks of ``DecisionCycle``) that fails a test
    which drives, resumes or reads the lease of a run: those are the cycle's, tested on
    PostgreSQL."""

    @property
    def leases(self) -> LeaseReader:
        raise AssertionError("no lease is read here")

    async def drive(
        self, agent: Agent, run: TaskRun, on_step: StepCallback | None, *, owner: str
    ) -> TaskRun:
        raise AssertionError("no run is driven here")

    async def resume(
        self, org_id: str, run_id: UUID, *, on_step: StepCallback | None = None, owner: str
    ) -> TaskRun:
        raise AssertionError("no run is resumed here")


if TYPE_CHECKING:
    from cortex_ray.runtime._runs import RunDriver

    _driver: RunDriver = NoDriver()  # mypy checks that it is the protocol
