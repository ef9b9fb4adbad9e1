"""Stock verl's ``RayPPOTrainer`` driven on CPU, so verl's own resume behaviour can be observed.

:class:`StockCpuRayPPOTrainer` keeps verl's ``fit`` loop structure and verl's ``_save_checkpoint`` /
``_load_checkpoint`` unchanged (sync only); it only adds the observer calls and the CPU rollout engine
of :class:`~agentlightning.verl.trainer.ObservedTrainingMixin`. Build one with
``build_cpu_trainer(..., async_enabled=False, trainer_cls=StockCpuRayPPOTrainer)``
(:mod:`agentlightning.verl.cpu_builder`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentlightning.verl.resume_selection import resolve_resume_folder
from agentlightning.verl.trainer import CONFIG_ENABLED, DEFAULT_INPUT_ID_KEY, ObservedTrainingMixin


class StockCpuRayPPOTrainer(ObservedTrainingMixin, RayPPOTrainer):
    """Stock verl on CPU: verl's ``fit`` loop structure with verl's save/load unchanged (sync only).

    Kept deliberately faithful to ``RayPPOTrainer.fit``: the epoch is ``global_steps // len(loader)``
    after loading, and each step trains on one loader batch. Reports to ``input_observer`` like
    :class:`~agentlightning.verl.trainer.AgentLightningRayPPOTrainer`.
    """

    def __init__(
        self,
        config: Any,
        *args: Any,
        rollout_engine: Any = None,
        input_observer: Any = None,
        input_id_key: str = DEFAULT_INPUT_ID_KEY,
        **kwargs: Any,
    ) -> None:
        if OmegaConf.select(config, CONFIG_ENABLED, default=False):
            raise ValueError(
                "StockCpuRayPPOTrainer is sync only: set agentlightning.async_rollout.enabled=false "
                "(build_cpu_trainer(..., async_enabled=False))"
            )
        super().__init__(config, *args, **kwargs)
        self._init_observed_training(rollout_engine, input_observer, input_id_key)

    def fit(self) -> None:
        """verl's loop: resume, derive the epoch from the step, one loader batch per step."""
        engine = self._require_engine()
        self.global_steps = 0
        self._load_checkpoint()
        if self.global_steps > 0:
            self.resumed_from = resolve_resume_folder(self.config)
        self._observe("resumed", self.global_steps, self.resumed_from)
        current_epoch = self.global_steps // len(self.train_dataloader)
        self.global_steps += 1
        for epoch in range(current_epoch, self.config.trainer.total_epochs):
            for batch in self.train_dataloader:
                step = self.global_steps
                self._submit(batch, step, epoch)
                self._train(engine.drain(step), step)
                is_last = step >= self.total_training_steps
                self._save_if_due(step, is_last)
                self.global_steps += 1
                if is_last:
                    return
