"""Options of the rooms above the models: what DECIDE does (``decide``), tool calls (``act``),
long-term memory (``memory``) and the governance checks (``governance``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["DecideOptions", "GovernanceOptions", "MemoryOptions", "ToolOptions"]


class DecideOptions(BaseModel):
    """What DECIDE is shown and how it chooses (``cortex_ray.decide``, ``perceive``, the
    cycle): ``Settings.decide``, ``CORTEX_DECIDE__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: int = Field(
        default=1,
        ge=1,
        le=8,
        description="K proposals per autonomous step (1: no evaluation call; measured better "
        "than 3 on the packaged models, docs/benchmarks.md)",
    )
    evaluation: Literal["choice", "scores"] = Field(
        default="choice",
        description="how EVALUATE judges K candidates: choice (a few words on each, then "
        "the best one's number) or scores (0-10 each); see docs/architecture.md",
    )
    default_max_steps: int = Field(
        default=8, ge=1, description="step budget of a run that asks for none"
    )
    max_steps_limit: int = Field(default=64, ge=1, description="the largest step budget a run gets")
    max_tool_rounds: int = Field(default=4, ge=1, description="tool calls per interactive turn")
    show_action_space: bool = Field(
        default=True, description="the prompt lists the tools the agent may call"
    )
    tool_retrieval_threshold: int = Field(
        default=20,
        ge=0,
        description="an agent holding more tools than this is shown only tool_retrieval_k of "
        "them, retrieved for the objective and the latest progress, plus the built-ins and "
        "the tools it already called (docs/architecture.md, Tool retrieval)",
    )
    tool_retrieval_k: int = Field(
        default=10,
        ge=1,
        description="tools retrieved into the action space above tool_retrieval_threshold "
        "(BM25 + dense, fused as knowledge search is)",
    )
    stop_after_repeats: int = Field(
        default=3,
        ge=0,
        description="a run whose planner has nothing but a call it already made for this "
        "many steps in a row ends FAILED, saying so (0: never)",
    )
    record_decisions: bool = Field(
        default=True,
        description="each autonomous step keeps what its DECIDE saw and its model calls' "
        "outputs (the run's cassette: eval cases replay it)",
    )
    progress_earlier_chars: int = Field(
        default=500,
        ge=64,
        description="earlier observations are shown to the planner cut to this many "
        "characters (the latest in full): a run's prompt stays within a small context",
    )
    conversation_window: int = Field(
        default=20, ge=1, description="recent turns of a conversation the prompt shows"
    )

    @model_validator(mode="after")
    def _check(self) -> DecideOptions:
        if self.default_max_steps > self.max_steps_limit:
            raise ValueError("default_max_steps must be <= max_steps_limit")
        return self


class ToolOptions(BaseModel):
    """Tool calls (``cortex_ray.act``): ``Settings.tools``, ``CORTEX_TOOLS__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(
        default=30.0, gt=0, description="a tool call running longer ends as TIMEOUT"
    )
    output_chars: int = Field(default=4000, ge=64, description="tool output kept in an observation")
    payload_inline_bytes: int = Field(
        default=4096,
        ge=64,
        description="a tool call's arguments or result larger than this (as JSON) is stored "
        "once per organisation by its sha256 and referenced from the audit row, not copied "
        'into it (docs/governance.md, "Workflow ledger")',
    )


class MemoryOptions(BaseModel):
    """Long-term memory (``cortex_ray.memory``; Generative Agents' retrieval score):
    ``Settings.memory``, ``CORTEX_MEMORY__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recall_alpha: float = Field(default=1.0, ge=0.0, description="weight of similarity")
    recall_beta: float = Field(default=1.0, ge=0.0, description="weight of recency")
    recall_gamma: float = Field(default=1.0, ge=0.0, description="weight of importance")
    recall_k: int = Field(default=5, ge=0, description="memories recalled into working memory")
    recall_candidates: int = Field(
        default=50, ge=1, description="nearest memories scored before the top recall_k"
    )
    recency_decay_per_hour: float = Field(
        default=0.995, gt=0.0, le=1.0, description="recency factor per hour since last access"
    )
    importance_scoring: Literal["model", "heuristic"] = Field(
        default="model",
        description="who scores a new memory's importance: the chat model or a heuristic",
    )
    importance_mode: Literal["background", "inline"] = Field(
        default="background",
        description="when the model scores importance: background (the memory is written at "
        "once with the heuristic score and rescored by the model after the write) or inline "
        "(before the write, waiting at most importance_timeout_s)",
    )
    importance_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="the longest one importance scoring waits for the model before the "
        "heuristic score stands (inline: keep it below tools.timeout_s)",
    )
    importance_rescore_concurrency: int = Field(
        default=1, ge=1, description="background importance scorings in flight per process"
    )
    importance_rescore_queue: int = Field(
        default=256,
        ge=1,
        description="memories waiting for background importance scoring per process; beyond "
        "it they keep the heuristic score",
    )


class GovernanceOptions(BaseModel):
    """Workflows, grants, approvals and secrets (``cortex_ray.governance``):
    ``Settings.governance``, ``CORTEX_GOVERNANCE__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_input_max_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="a workflow run's inputs, as JSON, at most (checked before its schema)",
    )
    schema_pattern_max_chars: int = Field(
        default=1000,
        ge=16,
        description="a `pattern` in a workflow version's input schema or a grant's "
        "constraints is at most this long when it is published or granted",
    )
    schema_pattern_budget_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="all the pattern matches of one check (a run's inputs against its "
        "version's schema, a call's arguments against a grant's constraints) together run at "
        "most this long: a catastrophic pattern is a refusal, not a hang",
    )
    grant_cache_s: float = Field(
        default=1.0,
        ge=0,
        description="how long a process reuses the connector grants it read for a call "
        "(0: read them on every call); a grant made or revoked through this process counts "
        "at once, through another within this time (docs/governance.md)",
    )
    approval_ttl_s: float = Field(
        default=86400.0,
        gt=0,
        description="how long an approval request waits for a person; then it expires, "
        "which counts as a rejection",
    )
    approval_poll_s: float = Field(
        default=0.5,
        gt=0,
        description="how often an interactive turn waiting for an approval reads its request "
        "(the decision is made in another process, through the API or the CLI)",
    )
    approval_excludes_requester: bool = Field(
        default=False,
        description="the person who started a run may not approve its calls",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="the key that encrypts each organisation's secrets at rest (32 bytes, "
        "urlsafe base64); unset: read from secret_key_file",
    )
    secret_key_file: Path | None = Field(
        default=None,
        description="a file holding that key; unset: storage.data_dir/secret.key, made (mode 0600) "
        "on first use",
    )
    secret_previous_keys: SecretStr | None = Field(
        default=None,
        description="older keys, comma-separated (urlsafe base64), still accepted for "
        "reading while `cortex-ray secrets rotate` re-seals every secret under the current "
        "key (docs/governance.md, Secrets)",
    )
