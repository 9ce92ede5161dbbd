"""The decision cycle: one PERCEIVE → DECIDE → ACT step shared by both kinds of agent
(``SharedStep``), and the two loops around it (LEARN at each loop's cadence, through
``cortex_ray.learn``): the autonomous loop (``AutonomousLoop``: leases, attempts, spans,
diagnostics; one step at a time, ``RunStep``) and the interactive turn
(``InteractiveTurn``). Approvals are their collaborators (``RunApprovals``,
``TurnApprovals``); ``DecisionCycle`` wires them; ``build_drivers`` is the one place DECIDE's
drivers are built (the runtime's and an evaluation replay's alike).

Each autonomous step is ONE transaction holding its ledger row (keyed by run id and step
index, so it can never be written twice), its audit row and its episodic memory. A run can
therefore be resumed from its ledger: ``resume`` continues after the last recorded step.
One driver at a time: ``resume`` and ``drive`` hold the run's lease while they drive, and
every write of theirs is fenced by its token (``cortex_ray.storage.RunLeases``), so a driver
that lost the run writes nothing more and stops (``LeaseLost``).
"""

from cortex_ray.cycle._approvals import RunApprovals, TurnApprovals
from cortex_ray.cycle._autonomous import AutonomousLoop
from cortex_ray.cycle._cycle import DecisionCycle
from cortex_ray.cycle._drivers import Drivers, build_drivers
from cortex_ray.cycle._events import StepCallback, TurnEventRelay, TurnEventSink, events_until
from cortex_ray.cycle._run_step import RunStep
from cortex_ray.cycle._runs import Timelines
from cortex_ray.cycle._step import CycleStep, SharedStep
from cortex_ray.cycle._turn import InteractiveTurn

__all__ = [
    "AutonomousLoop",
    "CycleStep",
    "DecisionCycle",
    "Drivers",
    "InteractiveTurn",
    "RunApprovals",
    "RunStep",
    "SharedStep",
    "StepCallback",
    "Timelines",
    "TurnApprovals",
    "TurnEventRelay",
    "TurnEventSink",
    "build_drivers",
    "events_until",
]
