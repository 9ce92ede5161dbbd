"""Model clients (chat completions) and embedders."""

from cortex_ray.models._backends import (
    ENTRY_POINT_GROUP,
    BackendOpener,
    ModelBackend,
    ModelParts,
    ModelSlot,
    backend_names,
    open_models,
    register_backend,
)
from cortex_ray.models._capacity import (
    CapacityReporter,
    Deadline,
    ModelCapacity,
    current_deadline,
    waiting_until,
)
from cortex_ray.models._guard import (
    check_model_request,
    is_local_model_url,
    model_requests_allowed,
    override_allow_model_requests,
    set_allow_model_requests,
)
from cortex_ray.models._packaged import (
    DEFAULT_MODEL_NAME,
    PACKAGED_MODELS,
    TEST_MODEL_NAME,
    ModelPart,
    PackagedModel,
    packaged_model,
    packaged_model_path,
)
from cortex_ray.models._protocol import (
    BACKGROUND_PRIORITY,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelClient,
    ToolCall,
    Usage,
)
from cortex_ray.models._recording import RecordingModelClient, recording, request_digest
from cortex_ray.models._structured import structured_call
from cortex_ray.models.embeddings import (
    Embedder,
    HashEmbedder,
    SentenceTransformerEmbedder,
    embed,
    embedder_name,
    packaged_minilm_path,
)
from cortex_ray.models.reranking import NO_RERANKER_MODEL, CrossEncoderReranker, Reranker, RerankHit
from cortex_ray.models.scripted import ScriptedModelClient

__all__ = [
    "BACKGROUND_PRIORITY",
    "DEFAULT_MODEL_NAME",
    "ENTRY_POINT_GROUP",
    "NO_RERANKER_MODEL",
    "PACKAGED_MODELS",
    "TEST_MODEL_NAME",
    "BackendOpener",
    "CapacityReporter",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "CrossEncoderReranker",
    "Deadline",
    "Embedder",
    "HashEmbedder",
    "ModelBackend",
    "ModelCapacity",
    "ModelClient",
    "ModelPart",
    "ModelParts",
    "ModelSlot",
    "PackagedModel",
    "RecordingModelClient",
    "RerankHit",
    "Reranker",
    "ScriptedModelClient",
    "SentenceTransformerEmbedder",
    "ToolCall",
    "Usage",
    "backend_names",
    "check_model_request",
    "current_deadline",
    "embed",
    "embedder_name",
    "is_local_model_url",
    "model_requests_allowed",
    "open_models",
    "override_allow_model_requests",
    "packaged_minilm_path",
    "packaged_model",
    "packaged_model_path",
    "recording",
    "register_backend",
    "request_digest",
    "set_allow_model_requests",
    "structured_call",
    "waiting_until",
]
