"""Settings: one options group per owner, composed by ``Settings``; loaded by
:func:`load_settings`. The bottom layer: it imports nothing of the rooms above it.

A room takes its own group (``MemoryService(db, embedder, settings.memory, ...)``), not the whole
``Settings``; the old flat names keep working through :data:`ALIASES`
(docs/operations.md, "Settings that moved").
"""

from cortex_ray.settings._aliases import ALIASES, DECIDE_SETTINGS, nest_flat_names
from cortex_ray.settings._connectors import ConnectorOptions
from cortex_ray.settings._knowledge import Fusion, RetrievalConfig
from cortex_ray.settings._models import (
    STRUCTURED_RETRIES,
    EmbeddingOptions,
    ModelOptions,
    StorageOptions,
    default_data_dir,
)
from cortex_ray.settings._observability import DiagnosticsOptions, LocalSpans, TracingOptions
from cortex_ray.settings._ray import (
    ApiOptions,
    GraphProjectionOptions,
    IngestJobOptions,
    RunPolicy,
    SessionPolicy,
)
from cortex_ray.settings._rooms import DecideOptions, GovernanceOptions, MemoryOptions, ToolOptions
from cortex_ray.settings._settings import (
    ENV_PREFIX,
    NESTED_DELIMITER,
    PROJECT_VARIABLES,
    Settings,
    alias_variables,
    load_settings,
    setting_field,
    setting_value,
    setting_variables,
    unknown_variables,
)
from cortex_ray.settings._table import alias_table, settings_table

__all__ = [
    "ALIASES",
    "DECIDE_SETTINGS",
    "ENV_PREFIX",
    "NESTED_DELIMITER",
    "PROJECT_VARIABLES",
    "STRUCTURED_RETRIES",
    "ApiOptions",
    "ConnectorOptions",
    "DecideOptions",
    "DiagnosticsOptions",
    "EmbeddingOptions",
    "Fusion",
    "GovernanceOptions",
    "GraphProjectionOptions",
    "IngestJobOptions",
    "LocalSpans",
    "MemoryOptions",
    "ModelOptions",
    "RetrievalConfig",
    "RunPolicy",
    "SessionPolicy",
    "Settings",
    "StorageOptions",
    "ToolOptions",
    "TracingOptions",
    "alias_table",
    "alias_variables",
    "default_data_dir",
    "load_settings",
    "nest_flat_names",
    "setting_field",
    "setting_value",
    "setting_variables",
    "settings_table",
    "unknown_variables",
]
