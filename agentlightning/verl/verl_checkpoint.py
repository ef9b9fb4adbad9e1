"""verl's checkpoint steps, done durably: the pieces of ``RayPPOTrainer._save_checkpoint`` and
``_load_checkpoint`` (verl 0.8 and 0.9, whose code is the same here) that the Agent Lightning trainer
performs itself.

Save, as verl: the actor (and critic) checkpoint through the worker groups, with verl's arguments;
``data.pt`` with ``torch.save(state, path)`` (the same bytes as verl's: ``torch.save`` names the zip
archive after the file, so a temporary name would change them); the tracker
``latest_checkpointed_iteration.txt`` holding ``str(step)``, skipped like verl when
``actor_rollout_ref.actor.checkpoint.async_save`` is set. Added: ``data.pt`` and its folder are fsynced
before the tracker is published, and the tracker is published atomically
(:func:`agentlightning.verl.durable.atomic_write_text`) instead of verl's plain ``open("w")``.

Load, as verl: the step from the folder name, the actor (and critic) through the worker groups. The
folder comes from :mod:`agentlightning.verl.resume_selection`, not from verl's unchecked tracker
read, and ``data.pt`` is read with ``torch.load(weights_only=True)`` (verl uses ``weights_only=False``,
which runs any pickled code the file holds).

Every path comes from :mod:`agentlightning.verl.verl_layout`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from omegaconf import OmegaConf

from agentlightning.verl import verl_layout as layout
from agentlightning.verl.durable import atomic_write_bytes, atomic_write_text, fsync_dir, fsync_file
from agentlightning.verl.errors import DataLoaderCheckpointError


def save_folder(config: Any, step: int) -> str:
    """The folder verl saves ``step`` to: ``<trainer.default_local_dir>/global_step_<step>``, as verl
    builds it (relative if the setting is)."""
    return layout.step_folder_path(config.trainer.default_local_dir, step)


def tracker_skipped(config: Any) -> bool:
    """verl writes no tracker when ``actor_rollout_ref.actor.checkpoint.async_save`` is true (the
    asynchronous saver publishes later); neither does this trainer."""
    return bool(OmegaConf.select(config, "actor_rollout_ref.actor.checkpoint.async_save", default=False))


def save_worker_checkpoints(trainer: Any, folder: str, step: int) -> None:
    """The actor (and critic) saves of verl's ``_save_checkpoint``, with the same arguments."""
    config = trainer.config
    remove_previous = config.trainer.get("remove_previous_ckpt_in_save", False)
    max_actor = config.trainer.get("max_actor_ckpt_to_keep", None) if not remove_previous else 1
    max_critic = config.trainer.get("max_critic_ckpt_to_keep", None) if not remove_previous else 1
    hdfs = config.trainer.default_hdfs_dir
    remote_folder = None if hdfs is None else layout.step_folder_path(hdfs, step)
    remote = None if remote_folder is None else layout.actor_path(remote_folder)
    trainer.actor_rollout_wg.save_checkpoint(layout.actor_path(folder), remote, step, max_ckpt_to_keep=max_actor)
    if trainer.use_critic:
        remote = None if remote_folder is None else layout.critic_path(remote_folder)
        trainer.critic_wg.save_checkpoint(layout.critic_path(folder), remote, step, max_ckpt_to_keep=max_critic)


def save_data_state(loader: Any, folder: str) -> None:
    """``data.pt`` written as verl writes it, then fsynced with its folder (before any tracker names it)."""
    os.makedirs(folder, exist_ok=True)
    path = layout.data_state_path(folder)
    torch.save(loader.state_dict(), path)
    fsync_file(path)
    fsync_dir(folder)


def _tracker(config: Any) -> str:
    """``<trainer.default_local_dir>/latest_checkpointed_iteration.txt``."""
    return layout.tracker_path(config.trainer.default_local_dir)


def read_tracker_bytes(config: Any) -> bytes | None:
    """The tracker's bytes as they are (None if it does not exist or cannot be read)."""
    try:
        with open(_tracker(config), "rb") as f:
            return f.read()
    except OSError:
        return None


def publish_tracker(config: Any, step: int) -> None:
    """Atomically point ``latest_checkpointed_iteration.txt`` at ``step`` (verl's text: ``str(step)``)."""
    atomic_write_text(str(step), _tracker(config))


def unpublish(config: Any, folder: str, step: int, previous_tracker: bytes | None) -> None:
    """After a failed save of ``step``: put the tracker back as it was if the save had already replaced
    it (a failure of the last fsync), then remove the folder's input file and ``data.pt`` so no resume
    takes the folder for a complete checkpoint. Best effort: the disk may be failing."""
    tracker = _tracker(config)
    current = read_tracker_bytes(config)
    names_step = current is not None and current.strip() == str(step).encode()
    if names_step and current != previous_tracker:
        with contextlib.suppress(OSError):
            if previous_tracker is None:
                os.remove(tracker)
            else:
                atomic_write_bytes(previous_tracker, tracker)
        current = read_tracker_bytes(config)
        names_step = current is not None and current.strip() == str(step).encode()
    if names_step:
        return  # the tracker could not be put back: keep the folder it names complete
    for path in (layout.input_state_path(folder), layout.data_state_path(folder)):
        if os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.remove(path)


def load_worker_checkpoints(trainer: Any, folder: str) -> None:
    """The actor (and critic) loads of verl's ``_load_checkpoint``, with the same arguments."""
    delete = trainer.config.trainer.del_local_ckpt_after_load
    trainer.actor_rollout_wg.load_checkpoint(layout.actor_path(folder), del_local_after_load=delete)
    if trainer.use_critic:
        trainer.critic_wg.load_checkpoint(layout.critic_path(folder), del_local_after_load=delete)


def load_data_state(folder: str) -> Any:
    """The loader state in ``folder``'s ``data.pt``, read with ``weights_only=True``."""
    path = layout.data_state_path(folder)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the file passed its zip check: what fails is its content
        raise DataLoaderCheckpointError(
            path,
            f"cannot be loaded with torch.load(weights_only=True) ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''})",
            "Keep the data loader state to tensors and plain Python values, or resume from another "
            "checkpoint with trainer.resume_mode=resume_path",
        ) from None
