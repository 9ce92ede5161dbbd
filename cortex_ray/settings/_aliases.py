"""The settings that moved into a group, by their old flat names: one table (:data:`ALIASES`).

Before issue 29 every setting of the core was a flat field (``Settings.model_name``,
``CORTEX_MODEL_NAME``); each now belongs to the options group of the room that reads it
(``Settings.models.name``, ``CORTEX_MODELS__NAME``). The old names keep working, through
this table only: as environment variables (the new name wins where both are set), as
keyword arguments (``Settings(model_name=...)``), in ``Settings.model_copy(update=...)`` and,
with a ``DeprecationWarning``, as attribute reads (``settings.model_name``).
docs/operations.md ("Settings that moved") lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ALIASES", "DECIDE_SETTINGS", "nest_flat_names"]

ALIASES: Mapping[str, tuple[str, str]] = {
    "database_url": ("storage", "database_url"),
    "data_dir": ("storage", "data_dir"),
    "pool_min_size": ("storage", "pool_min_size"),
    "pool_max_size": ("storage", "pool_max_size"),
    "migrate": ("storage", "migrate"),
    "model_backend": ("models", "backend"),
    "model_url": ("models", "url"),
    "model_name": ("models", "name"),
    "model_api_key": ("models", "api_key"),
    "local_model_path": ("models", "local_path"),
    "local_model_context": ("models", "local_context"),
    "local_model_threads": ("models", "local_threads"),
    "model_temperature": ("models", "temperature"),
    "model_max_tokens": ("models", "max_tokens"),
    "model_timeout_s": ("models", "timeout_s"),
    "model_max_retries": ("models", "max_retries"),
    "structured_retries": ("models", "structured_retries"),
    "models_app": ("models", "app"),
    "embedding_backend": ("embeddings", "backend"),
    "embedding_url": ("embeddings", "url"),
    "embedding_model": ("embeddings", "model"),
    "embedding_device": ("embeddings", "device"),
    "reranker_model": ("embeddings", "reranker_model"),
    "embedding_max_batch": ("embeddings", "max_batch"),
    "candidates": ("decide", "candidates"),
    "evaluation": ("decide", "evaluation"),
    "default_max_steps": ("decide", "default_max_steps"),
    "max_steps_limit": ("decide", "max_steps_limit"),
    "max_tool_rounds": ("decide", "max_tool_rounds"),
    "show_action_space": ("decide", "show_action_space"),
    "tool_retrieval_threshold": ("decide", "tool_retrieval_threshold"),
    "tool_retrieval_k": ("decide", "tool_retrieval_k"),
    "stop_after_repeats": ("decide", "stop_after_repeats"),
    "record_decisions": ("decide", "record_decisions"),
    "progress_earlier_chars": ("decide", "progress_earlier_chars"),
    "conversation_window": ("decide", "conversation_window"),
    "tool_timeout_s": ("tools", "timeout_s"),
    "tool_output_chars": ("tools", "output_chars"),
    "payload_inline_bytes": ("tools", "payload_inline_bytes"),
    "workflow_input_max_bytes": ("governance", "workflow_input_max_bytes"),
    "schema_pattern_max_chars": ("governance", "schema_pattern_max_chars"),
    "schema_pattern_budget_s": ("governance", "schema_pattern_budget_s"),
    "grant_cache_s": ("governance", "grant_cache_s"),
    "approval_ttl_s": ("governance", "approval_ttl_s"),
    "approval_poll_s": ("governance", "approval_poll_s"),
    "approval_excludes_requester": ("governance", "approval_excludes_requester"),
    "secret_key": ("governance", "secret_key"),
    "secret_key_file": ("governance", "secret_key_file"),
    "secret_previous_keys": ("governance", "secret_previous_keys"),
    "recall_alpha": ("memory", "recall_alpha"),
    "recall_beta": ("memory", "recall_beta"),
    "recall_gamma": ("memory", "recall_gamma"),
    "recall_k": ("memory", "recall_k"),
    "recall_candidates": ("memory", "recall_candidates"),
    "recency_decay_per_hour": ("memory", "recency_decay_per_hour"),
    "importance_scoring": ("memory", "importance_scoring"),
    "importance_mode": ("memory", "importance_mode"),
    "importance_timeout_s": ("memory", "importance_timeout_s"),
    "importance_rescore_concurrency": ("memory", "importance_rescore_concurrency"),
    "importance_rescore_queue": ("memory", "importance_rescore_queue"),
}
"""Old flat field name → (group, field): ``model_name`` → ``("models", "name")``."""

DECIDE_SETTINGS = (
    "candidates",
    "evaluation",
    "structured_retries",
    "show_action_space",
    "progress_earlier_chars",
    "stop_after_repeats",
)
"""The settings that shape what DECIDE asks its model and how it chooses: a step's recording
keeps their values under these (flat) names, and a replay uses them unless told otherwise
(docs/evaluation.md). Each is an entry of :data:`ALIASES`."""


def nest_flat_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each old flat name moved into its group: ``{"model_name": "x"}`` →
    ``{"models": {"name": "x"}}``. A flat name wins over the same field given in its group
    (it was named explicitly); a group given as a model keeps its other fields."""
    out = dict(data)
    moved: dict[str, dict[str, Any]] = {}
    for old in [k for k in out if k in ALIASES]:
        group, field = ALIASES[old]
        moved.setdefault(group, {})[field] = out.pop(old)
    for group, fields in moved.items():
        given = out.get(group)
        if given is None:
            base: dict[str, Any] = {}
        elif isinstance(given, Mapping):
            base = dict(given)
        elif hasattr(given, "model_fields"):
            # a group model: its fields as set (iterating a model yields (field, value))
            base = dict(given)
        else:
            continue  # not a group: left to validation, which reports it
        out[group] = base | fields
    return out
