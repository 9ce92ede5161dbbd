"""One place builds DECIDE's drivers (``cortex_ray.cycle.build_drivers``): the runtime's
cycle and an evaluation's replay get the same composer options, critic and recorder."""

from __future__ import annotations

from cortex_ray import Settings
from cortex_ray.cycle import build_drivers
from cortex_ray.models import RecordingModelClient, ScriptedModelClient


def test_the_drivers_share_one_composer_and_critic_and_record_their_calls() -> None:
    settings = Settings(show_action_space=False, progress_earlier_chars=123)
    model = ScriptedModelClient()
    drivers = build_drivers(settings, model)
    assert drivers.composer.show_action_space is False
    assert drivers.composer.earlier_chars == 123
    for driver in (drivers.autonomous, drivers.interactive):
        assert driver.composer is drivers.composer
        assert driver.critic is drivers.critic
        assert isinstance(driver.model, RecordingModelClient)
        assert driver.model.inner is model
    # Without a critic model the agent's own model reviews (same lineage).
    assert drivers.critic.model is drivers.autonomous.model
    assert not drivers.critic.independent


def test_a_critic_model_is_independent_and_a_replay_can_go_unrecorded() -> None:
    settings = Settings()
    model, critic = ScriptedModelClient(), ScriptedModelClient(name="critic")
    drivers = build_drivers(settings, model, critic_model=critic)
    assert drivers.critic.independent
    assert isinstance(drivers.critic.model, RecordingModelClient)
    assert drivers.critic.model.inner is critic
    unrecorded = build_drivers(settings, model, recorded=False)
    assert unrecorded.autonomous.model is model
    assert build_drivers(settings, None).autonomous.model is None
