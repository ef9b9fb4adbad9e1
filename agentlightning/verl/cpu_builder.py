"""Build a real verl trainer that runs end to end on CPU, without GPUs or Ray.

:func:`build_cpu_trainer` constructs a trainer with verl's real ``RayPPOTrainer`` constructor (real
``StatefulDataLoader`` from ``_create_dataloader``, real sampler from verl's ``create_rl_sampler``,
real ``_save_checkpoint``/``_load_checkpoint``); only the GPU work is replaced: the worker group is
:class:`~agentlightning.verl.cpu_workers.CpuActorWorkerGroup` (a tiny torch model with an optimizer)
and rollouts come from :class:`~agentlightning.verl.rollout.DeterministicRolloutEngine`. This module
owns the pieces of that build: the config (:func:`make_cpu_config`), the synthetic dataset and its
collate function, and the rollout latencies.

Rollout latencies can also follow a profile of :mod:`agentlightning.verl.schedule` keyed on the
admission order (:class:`AdmissionOrderLatency`), which makes the step schedule independent of the
shuffle order and seed, so it can be computed without running anything.

Used by the tests, the docs example and the resume-check target. ``trainer_cls`` builds stock verl
instead (:class:`agentlightning.verl.stock_trainer.StockCpuRayPPOTrainer`, sync only); the helpers
for tests (observers, simulated kills, trainers as they were before the fix) are
:mod:`agentlightning.verl.testing`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import Role

from agentlightning.verl.cpu_workers import CpuActorWorkerGroup
from agentlightning.verl.rollout import DeterministicRolloutEngine, LatencySpec, RowTransform
from agentlightning.verl.schedule import LatencyProfile
from agentlightning.verl.trainer import DEFAULT_INPUT_ID_KEY, AgentLightningRayPPOTrainer, add_agentlightning_config

if TYPE_CHECKING:
    from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer

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
    trainer_cls: type[AgentLightningRayPPOTrainer | StockCpuRayPPOTrainer] = AgentLightningRayPPOTrainer,
    ray_workers: int = 0,
) -> AgentLightningRayPPOTrainer | StockCpuRayPPOTrainer:
    """A constructed CPU trainer writing checkpoints to ``output_dir``; call ``.fit()`` to train.

    ``rollout_latency`` is the steps each rollout takes: an int, an inclusive ``(low, high)`` range
    drawn per input from ``seed``, or a function ``(input_id, epoch) -> steps``. ``latency_profile``,
    if given, replaces it with a profile keyed on the admission order (:class:`AdmissionOrderLatency`).
    Latencies above 1 make rollouts carry over between steps (async only; sync waits for all).
    ``rollout_transform`` is applied by the rollout engine to each input row it receives.
    ``trainer_cls`` may be :class:`~agentlightning.verl.stock_trainer.StockCpuRayPPOTrainer` (sync only)
    or a subclass of either trainer. ``ray_workers``: run the actor on verl's ``RayWorkerGroup`` with
    that many Ray actors (:mod:`agentlightning.verl.ray_workers`; the process connects to the Ray head
    named by ``RAY_ADDRESS``) instead of the in-process :class:`CpuActorWorkerGroup` (0, the default).
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
    engine = DeterministicRolloutEngine(seed=seed, latency=rollout_latency, transform=rollout_transform)
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
        rollout_engine=engine,
        input_id_key=input_id_key,
    )
    if latency_profile is not None:
        orders = epoch_orders(trainer.train_dataloader, total_epochs)
        engine.latency = AdmissionOrderLatency(latency_profile, orders)
    if ray_workers > 0:
        from agentlightning.verl.ray_workers import connect_driver, ray_worker_group

        connect_driver()
        trainer.actor_rollout_wg = ray_worker_group(ray_workers, feature_dim=FEATURE_DIM, seed=seed)
    else:
        trainer.actor_rollout_wg = CpuActorWorkerGroup(feature_dim=FEATURE_DIM, seed=seed)
    return trainer
