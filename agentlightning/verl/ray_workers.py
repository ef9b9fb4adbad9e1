"""The CPU actor worker on real Ray actors: verl's ``RayWorkerGroup`` over a ``Worker`` subclass.

:class:`~agentlightning.verl.cpu_workers.CpuActorWorkerGroup` does the worker group's job inside the
trainer's process. In production the group is verl's ``RayWorkerGroup``: one Ray actor per rank, in
processes of their own, reached through calls that verl dispatches to every rank and collects. This
module gives the trainer that group on CPU: :class:`CpuActorWorker` is a verl ``Worker`` whose every
rank holds the same tiny real model as the in-process stand-in (each rank a full replica, as in data
parallel training where every rank ends a step with the same weights), and :func:`ray_worker_group`
builds verl's ``RayWorkerGroup`` of them in a ``RayResourcePool`` without GPUs.

The calls the trainer makes (``update_actor``, ``save_checkpoint``, ``load_checkpoint``) keep verl's
signatures. verl sends each call to every rank; the answers are collected by :func:`collect_identical`,
which checks that every rank answered the same (replicas that drifted apart are an error) and gives the
trainer rank 0's, so the trainer code is the same for both groups. Each rank saves and loads its own file
in verl's actor folder, named as verl's FSDP checkpoint manager names its shards
(``model_world_size_{W}_rank_{R}.pt``), so a resume reads back every rank's state from across the
process boundary.

The worker group needs a running Ray (``ray.init`` done, e.g. as a driver of the head of
:mod:`agentlightning.verl.ray_cluster`). Importing this module defines things only.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import dispatch_one_to_all, register

from agentlightning.verl.cpu_workers import CpuActorWorkerGroup
from agentlightning.verl.inputs import Batch

#: The per-rank checkpoint file in verl's actor folder.
RANK_FILENAME = "model_world_size_{world_size}_rank_{rank}.pt"
DEFAULT_WORLD_SIZE = 2

ERR_DIVERGED = ("the {world_size} ranks of the CPU actor worker group answered one call differently (rank 0: "
                "{first!r}, rank {rank}: {other!r}): the replicas are no longer in step")


def collect_identical(worker_group: Any, outputs: list[Any]) -> Any:
    """verl collect function: every rank's answer must be the same; returns rank 0's. An answer may be a
    ``(digest, value)`` pair, compared by digest (state dicts of tensors)."""
    keys = [out[0] if isinstance(out, tuple) else out for out in outputs]
    for rank, key in enumerate(keys[1:], start=1):
        if key != keys[0]:
            raise RuntimeError(ERR_DIVERGED.format(world_size=len(outputs), first=keys[0],
                                                   rank=rank, other=key))
    first = outputs[0]
    return first[1] if isinstance(first, tuple) else first


#: verl dispatch mode: the same arguments to every rank, one answer back (checked equal across ranks).
ONE_TO_ALL_IDENTICAL = {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_identical}


def state_digest(state: Any) -> str:
    """A digest of a (nested) state dict's bytes as torch serialises them."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


class CpuActorWorker(Worker):
    """One rank of the CPU actor worker group: a replica of the tiny model, with verl's call signatures."""

    def __init__(self, feature_dim: int = 4, seed: int = 0, lr: float = 0.05) -> None:
        super().__init__()
        torch.set_num_threads(1)  # the replicas' arithmetic must match to the bit
        self.replica = CpuActorWorkerGroup(feature_dim=feature_dim, seed=seed, lr=lr,
                                           filename=RANK_FILENAME.format(world_size=self.world_size, rank=self.rank))

    @register(dispatch_mode=ONE_TO_ALL_IDENTICAL)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of this rank's replica on the whole batch; returns its metrics."""
        return self.replica.update_actor(batch)

    @register(dispatch_mode=ONE_TO_ALL_IDENTICAL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        """Write this rank's model, optimizer and update count into ``local_path`` (atomically)."""
        self.replica.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=ONE_TO_ALL_IDENTICAL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
                        ) -> None:
        """Load this rank's file from ``local_path``; a missing one names the rank and the fix."""
        self.replica.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    def pid(self) -> int:
        """This actor's process id (not a group call: ``worker_group.execute_all_sync("pid")`` asks each rank)."""
        import os

        return os.getpid()

    @register(dispatch_mode=ONE_TO_ALL_IDENTICAL)
    def checkpoint_state(self) -> tuple[str, dict[str, Any]]:
        """What this rank's checkpoint holds (model, optimizer, update count), with its digest."""
        state = self.replica.checkpoint_state()
        return state_digest(state), state


def ray_worker_group(world_size: int = DEFAULT_WORLD_SIZE, *, feature_dim: int = 4, seed: int = 0) -> Any:
    """verl's ``RayWorkerGroup`` of ``world_size`` :class:`CpuActorWorker` actors in a CPU-only
    ``RayResourcePool`` (one CPU per rank). Ray must be initialised."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([int(world_size)], use_gpu=False, max_colocate_count=1)
    actor = RayClassWithInitArgs(ray.remote(CpuActorWorker), feature_dim=feature_dim, seed=seed)
    return RayWorkerGroup(pool, actor, device_name="cpu")


ERR_NO_HEAD = ("the Ray worker group needs a running Ray to connect to: set RAY_ADDRESS=<host:port> of a Ray head "
               "(under pytest-resume-check the agentlightning_ray target's service starts one and sets it)")


def connect_driver() -> None:
    """Connect this process to the Ray head named by ``RAY_ADDRESS`` as a driver (once per process)."""
    import logging
    import os

    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        raise RuntimeError(ERR_NO_HEAD)
    # Ray reads its RAY_* settings (the head's token authentication among them) once per process; a process
    # forked after Ray was imported (the harness's fork server preloads verl) has them from before the
    # run's environment was set. Read them again.
    from ray._raylet import Config  # type: ignore[attr-defined]  # ray's _raylet.pyi lists a few of its classes

    Config.initialize("")
    # Likewise whether Ray is kept to this machine (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which the session's
    # head sets so that it listens on loopback only): read at import, it decides whether 127.0.0.1 in the
    # address is replaced by the machine's outward IP, where the head does not listen.
    from ray._private import ray_constants

    flag = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    if flag is not None and hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        ray_constants.ENABLE_RAY_CLUSTER = flag.strip().lower() in ("1", "true")
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)

