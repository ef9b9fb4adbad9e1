"""Trainer settings and the observer protocol."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402

from agentlightning.verl.cpu_builder import build_cpu_trainer, make_cpu_config  # noqa: E402
from agentlightning.verl.rollout import DeterministicRolloutEngine, RolloutEngine  # noqa: E402
from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer  # noqa: E402
from agentlightning.verl.testing import RecordingObserver  # noqa: E402
from agentlightning.verl.trainer import (  # noqa: E402
    CONFIG_ASYNC_TRAIN_BATCH_SIZE,
    AgentLightningRayPPOTrainer,
    AsyncRolloutConfigError,
    InputObserver,
    read_async_settings,
)


def test_the_trainer_is_reachable_lazily_from_the_package():
    import agentlightning.verl

    assert agentlightning.verl.AgentLightningRayPPOTrainer is AgentLightningRayPPOTrainer
    with pytest.raises(AttributeError):
        agentlightning.verl.NoSuchName  # noqa: B018


def test_an_async_batch_size_not_above_the_train_batch_size_is_a_clear_error(tmp_path):
    with pytest.raises(AsyncRolloutConfigError) as info:
        build_cpu_trainer(str(tmp_path), train_batch_size=4, async_train_batch_size=4)
    message = str(info.value)
    assert CONFIG_ASYNC_TRAIN_BATCH_SIZE in message and "data.train_batch_size=4" in message


def test_a_config_without_agentlightning_keys_means_sync_mode(tmp_path):
    config = make_cpu_config(str(tmp_path))
    del config["agentlightning"]
    settings = read_async_settings(config)
    assert not settings.enabled and settings.async_train_batch_size is None


def test_the_agentlightning_keys_exist_in_the_struct_mode_config(tmp_path):
    trainer = build_cpu_trainer(str(tmp_path))
    assert OmegaConf.is_struct(trainer.config)
    assert trainer.config.agentlightning.async_rollout.enabled is True
    assert trainer.config.agentlightning.async_rollout.async_train_batch_size == 6
    assert trainer.async_enabled


def test_the_stock_cpu_trainer_refuses_async_mode(tmp_path):
    with pytest.raises(ValueError, match="sync only"):
        build_cpu_trainer(str(tmp_path), trainer_cls=StockCpuRayPPOTrainer)


def test_fit_without_a_rollout_engine_says_how_to_provide_one(tmp_path):
    trainer = build_cpu_trainer(str(tmp_path))
    trainer.rollout_engine = None
    with pytest.raises(RuntimeError, match="needs a rollout engine"):
        trainer.fit()


def test_a_trainer_without_an_observer_trains_to_the_end(tmp_path):
    trainer = build_cpu_trainer(str(tmp_path), save_freq=4)
    assert trainer.input_observer is None
    trainer.fit()
    assert trainer.global_steps == 9  # verl's convention: one past the last step after fit()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_4", "global_step_8"]


def test_the_observer_sees_each_step_in_protocol_order(tmp_path):
    observer = RecordingObserver(checkpoint_steps={2})
    assert isinstance(observer, InputObserver)
    trainer = build_cpu_trainer(str(tmp_path), dataset_size=12, total_epochs=1)
    trainer.input_observer = observer
    trainer.fit()
    kinds = [(kind, step) for kind, step, _, _ in observer.events]
    assert kinds == [
        ("resumed", 0),
        ("consumed", 1), ("trained", 1), ("step_end", 1),
        ("consumed", 2), ("trained", 2), ("step_end", 2), ("checkpoint", 2),
    ]
    assert observer.events[-1][3] == str(tmp_path / "global_step_2")


def test_the_deterministic_engine_is_a_rollout_engine_with_seeded_latencies():
    engine = DeterministicRolloutEngine(seed=1, latency=(1, 3))
    assert isinstance(engine, RolloutEngine)
    latencies = [engine.latency_of(i, 0) for i in range(50)]
    assert set(latencies) == {1, 2, 3}
    again = DeterministicRolloutEngine(seed=1, latency=(1, 3))
    assert latencies == [again.latency_of(i, 0) for i in range(50)]
    with pytest.raises(ValueError, match="at least 1 step"):
        DeterministicRolloutEngine(latency=0)
