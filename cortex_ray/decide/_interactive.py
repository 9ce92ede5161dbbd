"""The interactive driver: the chat model proposes and selects one action in-turn.

The model gets the action space as OpenAI tools; a tool call becomes an ACT decision, plain
content a REPLY (a dialogue action the runtime sends through the same invocation gate).

A reply holding an unrendered ``{{placeholder}}`` never reaches the person: the model is
asked once more with a note (naming the tool that gives the value, when one does), and a
second such reply is refused with the reason. A tool call cut off at the token limit is
refused too (its arguments are incomplete); a repeated lead-in is said once.
"""

from __future__ import annotations

import json
from typing import Any

from cortex_ray._settings import Settings
from cortex_ray._tracing import tracer
from cortex_ray._types import AgentAction, Decision, DecisionKind, WorkingMemory
from cortex_ray.decide._answers import collapse_lead_in, placeholder_note, placeholders
from cortex_ray.models import ChatMessage, ChatRequest, ChatResponse, ModelClient
from cortex_ray.perceive import PromptComposer

__all__ = ["InteractiveDriver"]


class InteractiveDriver:
    """DECIDE for interactive agents: adapts the model's in-turn choice to a ``Decision``."""

    def __init__(
        self, model: ModelClient | None, composer: PromptComposer, settings: Settings
    ) -> None:
        self.model = model
        self.composer = composer
        self.settings = settings

    async def decide(self, wm: WorkingMemory, *, allow_tools: bool = True) -> Decision:
        if self.model is None:
            from cortex_ray.decide._autonomous import NO_MODEL_REASON

            return Decision(kind=DecisionKind.REPLY, failed=True, reason=NO_MODEL_REASON)
        tools = [t for t in wm.action_space if t.name != "reply"] if allow_tools else []
        messages = tuple(self.composer.render(wm))
        request = ChatRequest(
            messages=messages,
            tools=tuple(
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ),
        )
        with tracer.start_as_current_span("cortex.decide.interactive"):
            response = await self.model.chat(request)
            found = placeholders(response.content or "") if not response.tool_calls else []
            if found:  # once more, told why
                note = placeholder_note(found, (t.name for t in tools))
                response = await self.model.chat(
                    request.model_copy(
                        update={
                            "messages": (
                                *messages,
                                ChatMessage(role="assistant", content=response.content),
                                ChatMessage(role="user", content=note),
                            )
                        }
                    )
                )
        return self._decision(wm, response)

    @staticmethod
    def _decision(wm: WorkingMemory, response: ChatResponse) -> Decision:
        if response.tool_calls and response.finish_reason == "length":
            return Decision(
                kind=DecisionKind.REPLY,
                failed=True,
                reason=f"the model's call of {response.tool_calls[0].name} was cut off at "
                "the token limit",
            )
        if response.tool_calls:
            call = response.tool_calls[0]
            args: Any
            try:
                args = json.loads(call.arguments or "{}", strict=False)
            except json.JSONDecodeError:
                args = {"_unparsed": call.arguments}
            action_type = next(
                (t.action_type for t in wm.action_space if t.name == call.name), None
            )
            return Decision(
                kind=DecisionKind.ACT,
                action=AgentAction(
                    tool=call.name,
                    args=args if isinstance(args, dict) else {"_unparsed": call.arguments},
                    **({"action_type": action_type} if action_type else {}),
                ),
                reason="tool call chosen by the chat model",
            )
        text = collapse_lead_in((response.content or "").strip())
        if not text:
            return Decision(kind=DecisionKind.REPLY, failed=True, reason="the model said nothing")
        if found := placeholders(text):
            return Decision(
                kind=DecisionKind.REPLY,
                failed=True,
                reason=f"the model's reply held the unrendered placeholder {', '.join(found)} "
                "twice; not sent",
            )
        return Decision(
            kind=DecisionKind.REPLY, message=text, reason="reply chosen by the chat model"
        )
