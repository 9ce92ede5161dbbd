"""PERCEIVE: read long-term memory once, then build the typed working memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from uuid import UUID

from cortex_ray._types import (
    Agent,
    AgentMode,
    Observation,
    Principal,
    ToolSpec,
    Turn,
    WorkingMemory,
)
from cortex_ray.act import ToolDispatcher
from cortex_ray.observability import tracer
from cortex_ray.perceive._tool_retrieval import ToolRetriever, always_shown

if TYPE_CHECKING:
    from cortex_ray.memory import MemoryService

__all__ = ["WorkingMemoryAssembler"]


class WorkingMemoryAssembler:
    """Builds ``WorkingMemory`` for one cycle from ONE read of long-term memory.

    With ``tools`` (a :class:`ToolRetriever`), an agent holding more tools than its threshold
    is shown the ones retrieved for :meth:`recall_query` (the objective and the freshest
    progress) and those :func:`always_shown`; the others are ``hidden_tools``."""

    def __init__(
        self,
        memory: MemoryService,
        dispatcher: ToolDispatcher,
        *,
        recall_k: int,
        tools: ToolRetriever | None = None,
    ) -> None:
        self.memory = memory
        self.dispatcher = dispatcher
        self.recall_k = recall_k
        self.tools = tools

    @staticmethod
    def recall_query(
        objective: str, observations: Sequence[Observation], conversation: Sequence[Turn]
    ) -> str:
        """What to recall by: the objective plus the freshest context."""
        parts = [objective]
        if observations:
            parts.append(observations[-1].summary[:500])
        elif conversation:
            parts.extend(t.content[:300] for t in conversation[-2:])
        return "\n".join(parts)

    async def assemble(
        self,
        *,
        agent: Agent,
        mode: AgentMode,
        objective: str,
        caller: Principal | None = None,
        observations: Sequence[Observation] = (),
        conversation: Sequence[Turn] = (),
        step_index: int = 0,
        max_steps: int | None = None,
        run_id: UUID | None = None,
        allowed: Callable[[ToolSpec], bool] | None = None,
    ) -> WorkingMemory:
        with tracer.start_as_current_span(
            "perceive", attributes={"cortex.mode": mode.value, "cortex.step": step_index}
        ):
            query = self.recall_query(objective, observations, conversation)
            snapshot = await self.memory.snapshot(
                org_id=agent.org_id,
                agent_id=agent.id,
                query=query,
                k=self.recall_k,
                exclude_run=run_id,
            )
            await self.dispatcher.load_tools(agent.org_id)
            held: tuple[ToolSpec, ...] = tuple(
                spec
                for spec in self.dispatcher.action_space(agent, caller, mode)
                # An autonomous run has no person to reply to: its dialogue is the
                # finish message.
                if not (mode is AgentMode.AUTONOMOUS and spec.name == "reply")
                # a workflow run sees only what its version allows (the gate refuses the rest)
                and (allowed is None or allowed(spec))
            )
            shown = held
            hidden: tuple[ToolSpec, ...] = ()
            if self.tools is not None and self.tools.applies(len(held)):
                keep = always_shown(mode, observations, conversation)
                shown, hidden = await self.tools.shown(held, query, keep)
            return WorkingMemory(
                mode=mode,
                agent_name=agent.name,
                persona=agent.persona,
                skills=agent.skills,
                objective=objective,
                snapshot=snapshot,
                action_space=shown,
                hidden_tools=hidden,
                observations=tuple(observations),
                conversation=tuple(conversation),
                step_index=step_index,
                max_steps=max_steps,
                critic=agent.critic,
            )
