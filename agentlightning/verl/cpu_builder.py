"""CPU embedded defaults: build a real verl trainer that runs end to end without GPUs or Ray.

:func:`build_cpu_trainer` constructs a trainer with verl's real ``RayPPOTrainer`` constructor (real
``StatefulDataLoader`` from ``_create_dataloader``, real sampler from verl's ``create_rl_sampler``,
real ``_save_checkpoint``/``_load_checkpoint``); only the GPU work is replaced: the worker group is
:class:`~agentlightning.verl.cpu_workers.CpuActorWorkerGroup` (a tiny torch model with an optimizer)
and rollouts come from :class:`~agentlightning.verl.rollout.DeterministicRolloutEngine`.

Rollout latencies can also follow a profile of :mod:`agentlightning.verl.schedule` keyed on the
admission order (:class:`AdmissionOrderLatency`), which makes the step schedule independent of the
shuffle order and seed, so it can be computed without running anything.

Used by the tests, the docs example and the resume-check target. :class:`StockCpuRayPPOTrainer`
drives *stock* verl the same way (sync only, verl's loop structure, verl's save/load unchanged), so
verl's own resume behaviour can be observed on CPU.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import Role

from agentlightning.verl.cpu_workers import CpuActorWorkerGroup
from agentlightning.verl.resume_selection import resolve_resume_folder
from agentlightning.verl.rollout import DeterministicRolloutEngine, LatencySpec, RowTransform
from agentlightning.verl.schedule import LatencyProfile
from agentlightning.verl.trainer import (
    DEFAULT_INPUT_ID_KEY,
    AgentLightningRayPPOTrainer,
    ObservedTrainingMixin,
    add_agentlightning_config,
)

FEATURE_DIM = 4
# Dataset fields: one of each payload type the checkpoint must round-trip.
FEATURES_KEY = "features"  # torch.Tensor
PROMPT_KEY = "prompt"  # numpy object array of str
META_KEY = "meta"  # list of dicts


class SyntheticInputs(Dataset):
    """``size`` inputs, each a dict with an integer id, a feature vector, a prompt and metadata."""

    def __init__(self, size: int, *, seed: int = 0, input_id_key: str = DEFAULT_INPUT_ID_KEY) -> None:
        self.size = int(size)
        self.input_id_key = input_id_key
        generator = torch.Generator().manual_seed(int(seed))
        self.features = torch.randn(self.size, FEATURE_DIM, generator=generator)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            self.input_id_key: int(index),
            FEATURES_KEY: self.features[index],
            PROMPT_KEY: f"prompt {index}",
            META_KEY: {"source": "synthetic", "index": int(index)},
        }


def collate_inputs(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate dataset items: tensors are stacked, ints become an int64 tensor, str a numpy object
    array, anything else a list (a module-level function, so loader workers can pickle it)."""
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        first = values[0]
        if isinstance(first, torch.Tensor):
            out[key] = torch.stack(values)
        elif isinstance(first, int):
            out[key] = torch.tensor(values, dtype=torch.int64)
        elif isinstance(first, str):
            array = np.empty(len(values), dtype=object)
            array[:] = values
            out[key] = array
        else:
            out[key] = list(values)
    return out


def make_cpu_config(
    output_dir: str,
    *,
    async_enabled: bool = True,
    train_batch_size: int = 4,
    async_train_batch_size: int | None = 6,
    total_epochs: int = 2,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    resume_mode: str = "auto",
    resume_from_path: str | None = None,
    save_freq: int = -1,
) -> DictConfig:
    """The smallest verl config ``RayPPOTrainer`` accepts on CPU, with the agentlightning keys added."""
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "hybrid_engine": True,
                "model": {},
                "actor": {"use_kl_loss": False, "checkpoint": {}},
                "rollout": {"n": 1, "temperature": 1.0},
            },
            "algorithm": {"use_kl_in_reward": False, "adv_estimator": "grpo"},
            "reward": {"reward_model": {"enable": False}},
            "critic": {"enable": False},
            # No gen_batch_size key: verl 0.8 reads data.get("gen_batch_size", train_batch_size), so
            # an explicit None would make the loader batch size None there.
            "data": {
                "train_batch_size": train_batch_size,
                "val_batch_size": None,
                "dataloader_num_workers": num_workers,
                "shuffle": shuffle,
                "seed": seed,
                "validation_shuffle": False,
            },
            "trainer": {
                "device": "cpu",
                "project_name": "agentlightning-cpu",
                "experiment_name": "cpu",
                "logger": [],
                "total_epochs": total_epochs,
                "total_training_steps": None,
                "save_freq": save_freq,
                "default_local_dir": os.path.abspath(output_dir),
                "default_hdfs_dir": None,
                "resume_mode": resume_mode,
                "resume_from_path": resume_from_path,
                "del_local_ckpt_after_load": False,
                "max_actor_ckpt_to_keep": None,
                "max_critic_ckpt_to_keep": None,
            },
        }
    )
    async_size = async_train_batch_size if async_enabled else None
    return add_agentlightning_config(config, enabled=async_enabled, async_train_batch_size=async_size)


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
        if OmegaConf.select(config, "agentlightning.async_rollout.enabled", default=False):
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


class _Indices(Dataset):
    """A dataset whose item ``i`` is ``i``: stands in for a real one when only the order matters."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return int(index)


def epoch_orders(loader: Any, epochs: int) -> list[list[int]]:
    """The dataset indices ``loader`` yields in each of its first ``epochs`` passes from where its sampler
    stands now, computed without touching ``loader``.

    A stand-in ``StatefulDataLoader`` over an index dataset with the same batch size, ``drop_last`` and
    number of workers iterates a copy of the sampler (a sampler with a ``generator``, like torchdata's
    ``RandomSampler``, is rebuilt around a clone of that generator). Running a real loader matters: with
    loader workers, torchdata's iterator draws permutations the single-process one does not (epoch 0
    gets the generator's second permutation), so the order cannot be derived from the sampler alone.
    """
    sampler = loader.sampler
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, torch.Generator):
        clone = torch.Generator()
        clone.set_state(generator.get_state())
        sampler = type(sampler)(data_source=sampler.data_source, generator=clone)
    stand_in = StatefulDataLoader(
        _Indices(len(loader.dataset)),
        batch_size=loader.batch_size,
        sampler=sampler,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
        multiprocessing_context=loader.multiprocessing_context,
    )
    return [[int(i) for batch in stand_in for i in batch.tolist()] for _ in range(epochs)]


class AdmissionOrderLatency:
    """A latency per ``(input_id, epoch)`` that follows a profile keyed on the admission index.

    The admission index of an input is ``epoch * inputs_per_epoch + its position in that epoch's
    order``; ``orders`` lists each epoch's order (see :func:`epoch_orders`). The rollout of the k-th input
    admitted in a run therefore takes ``profile(k)`` steps whatever the shuffle order, so
    :func:`agentlightning.verl.schedule.simulate_async_schedule` predicts the run exactly. Inputs that are
    never admitted take one step.
    """

    def __init__(self, profile: LatencyProfile, orders: Sequence[Sequence[int]]) -> None:
        self.profile = profile
        self._index: dict[tuple[int, int], int] = {}
        offset = 0
        for epoch, order in enumerate(orders):
            for position, input_id in enumerate(order):
                self._index[(epoch, int(input_id))] = offset + position
            offset += len(order)

    def admission_index(self, input_id: int, epoch: int) -> int | None:
        """The admission index of ``input_id`` in input epoch ``epoch`` (None if never admitted)."""
        return self._index.get((int(epoch), int(input_id)))

    def __call__(self, input_id: int, epoch: int) -> int:
        index = self.admission_index(input_id, epoch)
        return 1 if index is None else int(self.profile(index))


def build_cpu_trainer(
    output_dir: str,
    *,
    async_enabled: bool = True,
    dataset_size: int = 24,
    train_batch_size: int = 4,
    async_train_batch_size: int = 6,
    total_epochs: int = 2,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    resume_mode: str = "auto",
    resume_from_path: str | None = None,
    save_freq: int = -1,
    rollout_latency: LatencySpec = 1,
    latency_profile: LatencyProfile | None = None,
    rollout_transform: RowTransform | None = None,
    input_id_key: str = DEFAULT_INPUT_ID_KEY,
    trainer_cls: type[RayPPOTrainer] = AgentLightningRayPPOTrainer,
) -> Any:
    """A constructed CPU trainer writing checkpoints to ``output_dir``; call ``.fit()`` to train.

    ``rollout_latency`` is the steps each rollout takes: an int, an inclusive ``(low, high)`` range
    drawn per input from ``seed``, or a function ``(input_id, epoch) -> steps``. ``latency_profile``,
    if given, replaces it with a profile keyed on the admission order (:class:`AdmissionOrderLatency`).
    Latencies above 1 make rollouts carry over between steps (async only; sync waits for all).
    ``rollout_transform`` is applied by the rollout engine to each input row it receives.
    ``trainer_cls`` may be :class:`StockCpuRayPPOTrainer` (sync only) or a subclass of either trainer.
    """
    config = make_cpu_config(
        output_dir,
        async_enabled=async_enabled,
        train_batch_size=train_batch_size,
        async_train_batch_size=async_train_batch_size,
        total_epochs=total_epochs,
        shuffle=shuffle,
        seed=seed,
        num_workers=num_workers,
        resume_mode=resume_mode,
        resume_from_path=resume_from_path,
        save_freq=save_freq,
    )
    train = SyntheticInputs(dataset_size, seed=seed, input_id_key=input_id_key)
    validation = SyntheticInputs(min(dataset_size, 2), seed=seed, input_id_key=input_id_key)
    trainer = trainer_cls(
        config=config,
        tokenizer=None,
        role_worker_mapping={Role.ActorRollout: CpuActorWorkerGroup},
        resource_pool_manager=None,
        train_dataset=train,
        val_dataset=validation,
        collate_fn=collate_inputs,
        train_sampler=None,  # verl's create_rl_sampler: seeded torchdata RandomSampler or sequential
        device_name="cpu",
        rollout_engine=DeterministicRolloutEngine(seed=seed, latency=rollout_latency, transform=rollout_transform),
        input_id_key=input_id_key,
    )
    if latency_profile is not None:
        orders = epoch_orders(trainer.train_dataloader, total_epochs)
        trainer.rollout_engine.latency = AdmissionOrderLatency(latency_profile, orders)
    trainer.actor_rollout_wg = CpuActorWorkerGroup(feature_dim=FEATURE_DIM, seed=seed)
    return trainer


class SimulatedKill(Exception):
    """Raised by :class:`RecordingObserver` to stop ``fit()`` abruptly at a chosen point."""


@dataclass
class RecordingObserver:
    """An :class:`~agentlightning.verl.trainer.InputObserver` that records every event in order.

    It can also steer the run: ``checkpoint_steps`` asks for saves at those steps, and
    ``kill_at_step_end`` / ``kill_after_checkpoint`` raise :class:`SimulatedKill` at the end of (before
    any save of) or right after the published save of that step. Events are tuples
    ``(kind, step, epoch, ids)``; ``epoch`` and ``ids`` are None where they do not apply.
    """

    checkpoint_steps: set[int] = field(default_factory=set)
    kill_at_step_end: int | None = None
    kill_after_checkpoint: int | None = None
    events: list[tuple[str, int, int | None, Any]] = field(default_factory=list)
    resumed_step: int | None = None
    resumed_path: str | None = None

    def resumed(self, step: int, path: str | None) -> None:
        self.resumed_step, self.resumed_path = step, path
        self.events.append(("resumed", step, None, path))

    def consumed(self, ids: list[int], step: int, epoch: int) -> None:
        self.events.append(("consumed", step, epoch, list(ids)))

    def trained(self, ids: list[int], step: int, epoch: int) -> None:
        self.events.append(("trained", step, epoch, list(ids)))

    def step_end(self, step: int) -> None:
        self.events.append(("step_end", step, None, None))
        if step == self.kill_at_step_end:
            raise SimulatedKill(f"killed at the end of step {step}")

    def should_checkpoint(self, step: int) -> bool:
        return step in self.checkpoint_steps

    def checkpoint_published(self, step: int, path: str) -> None:
        self.events.append(("checkpoint", step, None, path))
        if step == self.kill_after_checkpoint:
            raise SimulatedKill(f"killed after the checkpoint of step {step}")

    def ledger(self, kind: str = "consumed", *, up_to_step: int | None = None) -> list[tuple[int, int]]:
        """``(epoch, input_id)`` pairs of ``kind`` events in order (only steps <= ``up_to_step`` if given)."""
        return [
            (epoch, input_id)
            for event, step, epoch, ids in self.events
            if event == kind and (up_to_step is None or step <= up_to_step)
            for input_id in ids
        ]

    def steps(self) -> list[int]:
        """The steps that ended, in order."""
        return [step for event, step, _, _ in self.events if event == "step_end"]


class _StepCounter:
    def __init__(self) -> None:
        self.steps = 0

    def step_end(self, step: int) -> None:
        self.steps = max(self.steps, step)

    def __getattr__(self, name: str) -> Any:
        # The remaining observer calls are no-ops (should_checkpoint then answers None, i.e. no).
        return lambda *args: None


@functools.lru_cache(maxsize=64)
def _count_steps(key: tuple[tuple[str, Any], ...]) -> int:
    kwargs = dict(key)
    with tempfile.TemporaryDirectory(prefix="agentlightning-steps-") as output_dir:
        trainer = build_cpu_trainer(output_dir, resume_mode="disable", save_freq=-1, **kwargs)
        counter = _StepCounter()
        trainer.input_observer = counter
        trainer.fit()
    return counter.steps


def steps_for(
    *,
    async_enabled: bool = True,
    dataset_size: int = 24,
    train_batch_size: int = 4,
    async_train_batch_size: int = 6,
    total_epochs: int = 2,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    rollout_latency: LatencySpec = 1,
    latency_profile: LatencyProfile | None = None,
    trainer_cls: type[RayPPOTrainer] = AgentLightningRayPPOTrainer,
) -> int:
    """Number of steps an uninterrupted :func:`build_cpu_trainer` run with these parameters takes.

    Computed by running that configuration once, uncheckpointed, in a temporary directory (a few
    tenths of a second on CPU), so it is exact for any latency and shuffle; results are cached.
    ``rollout_latency`` and ``latency_profile`` must be hashable (ints, tuples, module-level functions).
    """
    key = (
        ("async_enabled", async_enabled),
        ("dataset_size", dataset_size),
        ("train_batch_size", train_batch_size),
        ("async_train_batch_size", async_train_batch_size),
        ("total_epochs", total_epochs),
        ("shuffle", shuffle),
        ("seed", seed),
        ("num_workers", num_workers),
        ("rollout_latency", rollout_latency),
        ("latency_profile", latency_profile),
        ("trainer_cls", trainer_cls),
    )
    return _count_steps(key)
