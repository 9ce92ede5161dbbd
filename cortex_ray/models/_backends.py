"""The one registry of model backends: how a runtime gets its chat model, embedder and
reranker from the settings' ``models.backend`` and ``embeddings.backend``.

The core registers the backends it can open in any process (``local``, ``openai``,
``none``, ``hash``). Other layers add theirs without the core importing them: the Ray
layer's ``served`` backend (Serve deployment handles) is found through the
``cortex_ray.backends`` entry point group (pyproject.toml) or registered when
``serve.models`` is imported. One backend name is opened once per runtime, for every slot
that names it, so a backend that connects somewhere (handles, a pool) does it once.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from cortex_ray._exceptions import ConfigurationError
from cortex_ray._types import EMBEDDING_DIM
from cortex_ray.models._protocol import ModelClient
from cortex_ray.models.embeddings import Embedder, HashEmbedder
from cortex_ray.models.reranking import Reranker
from cortex_ray.settings import Settings

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendOpener",
    "ModelBackend",
    "ModelParts",
    "ModelSlot",
    "backend_names",
    "open_models",
    "register_backend",
]

log = logging.getLogger("cortex_ray.models")

ENTRY_POINT_GROUP = "cortex_ray.backends"
"""Entry points in this group name a ``ModelBackend`` object (``module:attribute``)."""

ModelSlot = Literal["chat", "embedder"]
"""What a runtime asks a backend for: its chat model, its embedder."""


@dataclass(frozen=True, slots=True)
class ModelParts:
    """What a backend opened: the slots it was asked for, and a reranker if it has one."""

    chat: ModelClient | None = None
    embedder: Embedder | None = None
    reranker: Reranker | None = None


BackendOpener = Callable[[Settings, frozenset[ModelSlot]], Awaitable[ModelParts]]
"""Opens the asked slots from the settings. Raise ``ConfigurationError`` for what it cannot
open (say which setting to change). It takes the whole ``Settings``, not one group: a
backend reads ``models``, ``embeddings`` and ``storage.data_dir``, and a backend of another
layer (the entry point group) may read more; it is the models room's composition point."""


@dataclass(frozen=True, slots=True)
class ModelBackend:
    """A named way to open models.

    Attributes:
        name: The value of ``model_backend`` / ``embedding_backend`` that selects it.
        open: Opens the slots asked for.
        slots: The slots it can fill; asking for another is a ``ConfigurationError``.
    """

    name: str
    open: BackendOpener
    slots: frozenset[ModelSlot] = field(default_factory=lambda: frozenset(("chat", "embedder")))


_registry: dict[str, ModelBackend] = {}


def register_backend(backend: ModelBackend) -> None:
    """Make ``backend`` openable by its name (a later registration of a name replaces it)."""
    _registry[backend.name] = backend


def _lookup(name: str) -> ModelBackend:
    found = _registry.get(name)
    if found is not None:
        return found
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            loaded = entry.load()
        except ImportError as exc:
            raise ConfigurationError(
                f"the model backend {name!r} ({entry.value}) cannot be imported here: {exc}"
            ) from exc
        if not isinstance(loaded, ModelBackend):
            raise ConfigurationError(f"entry point {entry.value} is not a ModelBackend")
        register_backend(loaded)
        return loaded
    raise ConfigurationError(
        f"no model backend {name!r} in this process (known: {', '.join(backend_names())})"
    )


def backend_names() -> list[str]:
    """The backends registered here or advertised by an installed entry point."""
    advertised = {e.name for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(set(_registry) | advertised)


async def open_models(
    settings: Settings, slots: Iterable[ModelSlot] = ("chat", "embedder")
) -> ModelParts:
    """Open the asked slots through the backends the settings name, each backend once.

    A slot left out (the caller passes its own model or embedder) is not opened. If one
    backend fails, what the others opened is closed again before the error propagates.
    """
    wanted = frozenset(slots)
    by_backend: dict[str, set[ModelSlot]] = {}
    if "chat" in wanted:
        by_backend.setdefault(settings.models.backend, set()).add("chat")
    if "embedder" in wanted:
        by_backend.setdefault(settings.embeddings.backend, set()).add("embedder")
    opened: list[ModelParts] = []
    try:
        for name, asked in by_backend.items():
            backend = _lookup(name)
            missing = asked - backend.slots
            if missing:
                setting = "model_backend" if "chat" in missing else "embedding_backend"
                raise ConfigurationError(
                    f"{setting}={name}: the {name!r} backend has no {'/'.join(sorted(missing))}"
                )
            opened.append(await backend.open(settings, frozenset(asked)))
    except BaseException:
        for parts in opened:
            if parts.chat is not None:
                await parts.chat.aclose()
        raise
    chat = next((p.chat for p in opened if p.chat is not None), None)
    embedder = next((p.embedder for p in opened if p.embedder is not None), None)
    reranker = next((p.reranker for p in opened if p.reranker is not None), None)
    return ModelParts(chat=chat, embedder=embedder, reranker=reranker)


# the backends every process has ---------------------------------------------------------


async def _open_local(settings: Settings, slots: frozenset[ModelSlot]) -> ModelParts:
    chat: ModelClient | None = None
    embedder: Embedder | None = None
    if "chat" in slots:
        from cortex_ray.models.llama_cpp import LlamaCppClient

        chat = LlamaCppClient(
            settings.models.local_path,
            model_name=settings.models.name,
            data_dir=settings.storage.data_dir,
            n_ctx=settings.models.local_context,
            n_threads=settings.models.local_threads,
            default_temperature=settings.models.temperature,
            default_max_tokens=settings.models.max_tokens,
        )
    if "embedder" in slots:
        from cortex_ray.models.embeddings import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(
            settings.embeddings.model, device=settings.embeddings.device
        )
    return ModelParts(chat=chat, embedder=embedder)


async def _open_openai(settings: Settings, slots: frozenset[ModelSlot]) -> ModelParts:
    chat: ModelClient | None = None
    embedder: Embedder | None = None
    if "chat" in slots:
        from cortex_ray.models.openai_compatible import OpenAICompatibleClient

        if settings.models.url is None:
            raise ConfigurationError("models.backend=openai needs models.url (CORTEX_MODELS__URL)")
        chat = OpenAICompatibleClient(
            settings.models.url,
            settings.models.name,
            api_key=settings.models.api_key,
            timeout_s=settings.models.timeout_s,
            max_retries=settings.models.max_retries,
            default_temperature=settings.models.temperature,
            default_max_tokens=settings.models.max_tokens,
        )
    if "embedder" in slots:
        from cortex_ray.models.openai_embeddings import OpenAICompatibleEmbedder

        embedder = OpenAICompatibleEmbedder.from_options(settings.embeddings, settings.models)
    return ModelParts(chat=chat, embedder=embedder)


async def _open_none(settings: Settings, slots: frozenset[ModelSlot]) -> ModelParts:
    return ModelParts()


async def _open_hash(settings: Settings, slots: frozenset[ModelSlot]) -> ModelParts:
    return ModelParts(embedder=HashEmbedder(EMBEDDING_DIM))


register_backend(ModelBackend("local", _open_local))
register_backend(ModelBackend("openai", _open_openai))
register_backend(ModelBackend("none", _open_none, frozenset(("chat",))))
register_backend(ModelBackend("hash", _open_hash, frozenset(("embedder",))))
