"""The one place DECIDE's drivers are built: by the runtime for the cycle, and by an
evaluation's replay, so a replay decides as production does (the same composer options,
critic and recorder)."""

from __future__ import annotations

from dataclasses import dataclass

from cortex_ray.decide import AutonomousDriver, Critic, InteractiveDriver
from cortex_ray.models import ModelClient, RecordingModelClient
from cortex_ray.perceive import PromptComposer
from cortex_ray.settings import Settings

__all__ = ["Drivers", "build_drivers"]


@dataclass(frozen=True, slots=True)
class Drivers:
    """DECIDE's parts: the prompt composer they share, the critic, and one driver a mode."""

    composer: PromptComposer
    critic: Critic
    autonomous: AutonomousDriver
    interactive: InteractiveDriver


def build_drivers(
    settings: Settings,
    model: ModelClient | None,
    *,
    critic_model: ModelClient | None = None,
    recorded: bool = True,
) -> Drivers:
    """The drivers of ``model`` under ``settings``.

    The critic (the inner voice of agents with critic on) is ``critic_model`` when one is
    given, else the agent's own model with a reviewer's prompt (same lineage, said so in the
    log). With ``recorded`` the drivers' calls go through a recorder
    (``RecordingModelClient``: inside an autonomous step's DECIDE each one is kept for the
    step's cassette; elsewhere it forwards, with its span and metrics); a replay answering
    from a recording passes ``recorded=False`` (its calls are the recording's own).
    """
    composer = PromptComposer(
        show_action_space=settings.decide.show_action_space,
        earlier_chars=settings.decide.progress_earlier_chars,
    )
    deciding = _recorder(model, settings) if recorded else model
    reviewing = deciding
    if critic_model is not None:
        reviewing = _recorder(critic_model, settings) if recorded else critic_model
    retries = settings.models.structured_retries
    critic = Critic(
        reviewing, composer, structured_retries=retries, independent=critic_model is not None
    )
    return Drivers(
        composer=composer,
        critic=critic,
        autonomous=AutonomousDriver(
            deciding, composer, settings.decide, structured_retries=retries, critic=critic
        ),
        interactive=InteractiveDriver(deciding, composer, critic=critic),
    )


def _recorder(model: ModelClient | None, settings: Settings) -> ModelClient | None:
    return None if model is None else RecordingModelClient(model, capture=settings.tracing)
