"""Model serving on Ray Serve: embeddings, reranking and chat behind OpenAI-compatible routes.

``build_app`` (a Serve import path: ``serve.models:build_app``) deploys, from a
``ModelServingConfig``: the ``Embedder`` (sentence-transformers, ``@serve.batch``), the
``Reranker`` (a CrossEncoder, or unavailable), the ``LLM`` (llama.cpp on CPU, Ray Serve LLM
with vLLM on GPU) and the ``ModelIngress`` (FastAPI: ``/v1/models``, ``/v1/embeddings``,
``/v1/chat/completions``, ``/v1/rerank``, ``/health``). ``HandleEmbedder``,
``HandleModelClient`` and ``HandleReranker`` give code inside the cluster the core's model
seams over deployment handles; ``SERVED_BACKEND`` is the ``served`` model backend that
``Runtime.open`` finds by entry point (``open_served_runtime`` remains as an alias of
``Runtime.open``). Guide: docs/model_serving.md.
"""

from serve.models._builder import (
    DEFAULT_MODELS_APP,
    LocalModels,
    build_app,
    build_models_app,
    run_local,
)
from serve.models._config import (
    DeploymentOptions,
    EmbedderConfig,
    IngressConfig,
    LlmConfig,
    ModelServingConfig,
    RerankerConfig,
)
from serve.models._embedder import EMBEDDER_NAME, EmbedderDeployment, EmbedderServer
from serve.models._handles import (
    SERVED_BACKEND,
    HandleEmbedder,
    HandleModelClient,
    HandleReranker,
    ModelHandles,
    open_served_runtime,
    served_settings,
    serving_config_for,
)
from serve.models._ingress import INGRESS_NAME, ModelIngress, create_model_app
from serve.models._llm import LLM_NAME, LlamaCppDeployment, LlamaCppServer, build_vllm_deployment
from serve.models._openai import Failure
from serve.models._reranker import RERANKER_NAME, RerankerDeployment, RerankerServer

__all__ = [
    "DEFAULT_MODELS_APP",
    "EMBEDDER_NAME",
    "INGRESS_NAME",
    "LLM_NAME",
    "RERANKER_NAME",
    "SERVED_BACKEND",
    "DeploymentOptions",
    "EmbedderConfig",
    "EmbedderDeployment",
    "EmbedderServer",
    "Failure",
    "HandleEmbedder",
    "HandleModelClient",
    "HandleReranker",
    "IngressConfig",
    "LlamaCppDeployment",
    "LlamaCppServer",
    "LlmConfig",
    "LocalModels",
    "ModelHandles",
    "ModelIngress",
    "ModelServingConfig",
    "RerankerConfig",
    "RerankerDeployment",
    "RerankerServer",
    "build_app",
    "build_models_app",
    "build_vllm_deployment",
    "create_model_app",
    "open_served_runtime",
    "run_local",
    "served_settings",
    "serving_config_for",
]
