"""The interactive driver: the chat model proposes and selects one action in-turn.

The model gets the action space as OpenAI tools; a tool call becomes an ACT decision, plain
content a REPLY (a dialogue action the runtime sends through the same invocation gate).

A reply holding an unrendered ``{{placeholder}}`` never reaches the person: the model is
asked once more with a note (naming the tool that gives the value, when one does), and a
second such reply is refused with the reason. A tool call cut off at the token limit is
refused too (its arguments are incomplete); a repeated lead-in is said once.

A tool call that repeats one this turn already made, with the same arguments, is not made
again: its result is in the prompt, so the model is asked for its reply instead, told so
(small models otherwise call the same tool every round until the round limit).

Two repairs for what the agent benchmark measured Qwen 1.5B doing in conversations: a reply
whose placeholder stands for the value of a tool that takes no arguments ("It is [insert
current date and time]": ``current_time``) becomes that call, since the model said which
value it needed; and a reply that says it stored something ("I have stored the fact that
your cat is called Tom") when no memory tool was called this turn is sent back once, told
that nothing was stored and which tool stores it.

An optional argument whose text nothing gave (not the person, a result or a memory) is left
out of the call, so the tool's default applies (``made_up_optionals``), as in the autonomous
planner.
"""

from __future__ import annotations

import json
from typing import Any

from cortex_ray._types import (
    ActionType,
    AgentAction,
    Decision,
    DecisionKind,
    ToolSpec,
    WorkingMemory,
)
from cortex_ray.decide._answers import (
    claims_a_write,
    collapse_lead_in,
    evidence_of,
    made_up_optionals,
    placeholder_note,
    placeholders,
    tools_named,
)
from cortex_ray.decide._autonomous import NO_MODEL_REASON
from cortex_ray.decide._critic import Critic
from cortex_ray.models import ChatMessage, ChatRequest, ChatResponse, ModelClient
from cortex_ray.observability import tracer
from cortex_ray.perceive import PromptComposer, call_text, repeat_of

__all__ = ["InteractiveDriver"]


class InteractiveDriver:
    """DECIDE for interactive agents: adapts the model's in-turn choice to a ``Decision``."""

    def __init__(
        self,
        model: ModelClient | None,
        composer: PromptComposer,
        *,
        critic: Critic | None = None,
    ) -> None:
        self.model = model
        self.composer = composer
        self.critic = critic

    async def decide(self, wm: WorkingMemory, *, allow_tools: bool = True) -> Decision:
        if self.model is None:
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
        with tracer.start_as_current_span("propose"):
            response = await self.model.chat(request)
            names = [t.name for t in tools]
            found = placeholders(response.content or "", names) if not response.tool_calls else []
            slot = self._slot_tool(found, tools) if found else None
            if slot is not None and repeat_of(wm.observations, slot.name, {}) is None:
                return Decision(
                    kind=DecisionKind.ACT,
                    action=AgentAction(tool=slot.name, args={}, action_type=slot.action_type),
                    reason=f"the reply held {', '.join(found)}, the value {slot.name} gives: "
                    "called it",
                )
            learning = [t.name for t in tools if t.action_type is ActionType.LEARNING]
            wrote = any(o.action_type is ActionType.LEARNING for o in wm.observations)
            claimed = (
                not found
                and not response.tool_calls
                and learning
                and not wrote
                and claims_a_write(response.content or "")
            )
            if claimed:
                found, note = (
                    [],
                    (
                        "Your reply says you stored it, but you called no tool, so nothing is "
                        f"stored. Call {' or '.join(learning)} to store it, then answer."
                    ),
                )
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
            if found:  # once more, told why
                note = placeholder_note(found, names)
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
            repeated = self._repeated(wm, response)
            if repeated is not None:
                step, text = repeated
                note = (
                    f"You already called {text} (call {step}); its result is above and will "
                    "not change. Answer the person now with what it gave."
                )
                response = await self.model.chat(
                    request.model_copy(
                        update={
                            "messages": (*messages, ChatMessage(role="user", content=note)),
                            "tools": (),
                        }
                    )
                )
        decision = self._decision(wm, response)
        if repeated is not None:
            decision = decision.model_copy(
                update={
                    "reason": f"{decision.reason}; a repeated call of {repeated[1]} was not made"
                }
            )
        if (
            decision.kind is DecisionKind.REPLY
            and decision.message
            and wm.critic
            and self.critic is not None
        ):
            review = await self.critic.review(wm, decision.message, self.model)
            decision = decision.model_copy(
                update={"message": review.answer, "reason": f"{decision.reason}; {review.note()}"}
            )
        return decision

    @staticmethod
    def _slot_tool(found: list[str], tools: list[ToolSpec]) -> ToolSpec | None:
        """The one tool without required arguments whose value the placeholders stand for
        (its name, or every word of it, in the slot), or None."""
        named = set(tools_named(found, [t.name for t in tools]))
        callable_ = [t for t in tools if t.name in named and not t.parameters.get("required")]
        return callable_[0] if len(named) == 1 and callable_ else None

    @staticmethod
    def _repeated(wm: WorkingMemory, response: ChatResponse) -> tuple[int, str] | None:
        """The earlier call (its number, its text) that the response's tool call repeats."""
        if not response.tool_calls or not wm.observations:
            return None
        call = response.tool_calls[0]
        try:
            args = json.loads(call.arguments or "{}", strict=False)
        except json.JSONDecodeError:
            return None
        if not isinstance(args, dict):
            return None
        step = repeat_of(wm.observations, call.name, args)
        return None if step is None else (step, call_text(call.name, args))

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
            spec = next((t for t in wm.action_space if t.name == call.name), None)
            if not isinstance(args, dict):
                args = {"_unparsed": call.arguments}
            reason = "tool call chosen by the chat model"
            if spec is not None and (
                dropped := made_up_optionals(spec.parameters, args, evidence_of(wm))
            ):
                # As in the autonomous planner: an optional value nothing in the conversation,
                # the results or the memories gave is left to the tool's default.
                left_out = ", ".join(f"{k}={args[k]!r}" for k in dropped)
                args = {k: v for k, v in args.items() if k not in dropped}
                reason += f"; left out {left_out}: optional, and nothing gave the value"
            return Decision(
                kind=DecisionKind.ACT,
                action=AgentAction(
                    tool=call.name,
                    args=args,
                    **({"action_type": spec.action_type} if spec else {}),
                ),
                reason=reason,
            )
        text = collapse_lead_in((response.content or "").strip())
        if not text:
            return Decision(kind=DecisionKind.REPLY, failed=True, reason="the model said nothing")
        if found := placeholders(text, (t.name for t in wm.action_space)):
            return Decision(
                kind=DecisionKind.REPLY,
                failed=True,
                reason=f"the model's reply held the unrendered placeholder {', '.join(found)} "
                "twice; not sent",
            )
        return Decision(
            kind=DecisionKind.REPLY, message=text, reason="reply chosen by the chat model"
        )
