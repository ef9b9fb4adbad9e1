"""``AgentLightningRayPPOTrainer``: verl's ``RayPPOTrainer`` whose async inputs survive checkpoint and resume.

The bug this fixes: an async refill takes ``async_train_batch_size - carried_over`` inputs per step
from a loader that yields batches of ``data.train_batch_size``, so the trainer buffers the unused tail
of a loader batch while the loader has already moved past it. verl's checkpoint saves the loader
(``data.pt``) but not that buffer, so a resume silently skipped the buffered inputs. verl also guesses
the epoch from the optimizer step (``global_steps // len(loader)``) and, in 0.8/0.9, skips restoring
``data.pt`` when ``global_steps % len(loader) == 0``; neither describes async input consumption.

The fix, wired in here:

* Save (async): ``agentlightning_input.pt`` (see :mod:`agentlightning.verl.input_file`) is written into
  ``global_step_N/`` atomically *before* the model and ``data.pt``, and the tracker is published last,
  atomically, so it never names a folder without a complete input file. Sync checkpoints hold verl's
  files with verl's bytes.
* Crash safety: the trainer performs verl's save and load steps itself
  (:mod:`agentlightning.verl.verl_checkpoint`) so that every file is durable before the tracker names
  it and the tracker is replaced atomically; a resume takes the tracker's folder only if it is complete
  and otherwise falls back, with a warning, to the newest complete one
  (:mod:`agentlightning.verl.resume_selection`). A failed save leaves the previous checkpoint selected.
* Load: after verl's state (step and model) is restored, the input file (when present) restores the exact
  input position and epoch; it is authoritative over verl's epoch-boundary heuristic, and ``fit()``
  keeps the restored epoch.
* Carry-over (format version 2): inputs whose rollouts are still running at a save have left the loader
  and the buffer. The input file also holds their original rows with the step each was first submitted
  in (:mod:`agentlightning.verl.inflight`); a resume resets the rollout engine and resubmits them first,
  in order and with that step, and the next refill counts them, so the active window, the finishing
  steps and the total number of steps equal the uninterrupted run's.
* Epoch limits: a refill never takes inputs beyond ``trainer.total_epochs``; training ends after the
  step that trains the last admitted input.

``fit()`` here is a compact loop that runs on CPU with the embedded defaults of
:mod:`agentlightning.verl.cpu_builder` (verl's own ``fit`` needs GPU rollout managers). Step numbering is
verl's: the first step is ``global_steps == 1`` and ``global_step_N`` holds the state after N steps.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from omegaconf import OmegaConf, open_dict
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentlightning.verl.inflight import InFlightInputs
from agentlightning.verl.input_file import write_input_state
from agentlightning.verl.input_format import InputCheckpoint
from agentlightning.verl.inputs import BufferedInputStream, ids_of
from agentlightning.verl.resume_selection import choose_resume_folder
from agentlightning.verl.rollout import CompletedRollouts, RolloutEngine
from agentlightning.verl.verl_checkpoint import (
    load_data_state,
    load_worker_checkpoints,
    publish_tracker,
    read_tracker_bytes,
    save_data_state,
    save_folder,
    save_worker_checkpoints,
    tracker_skipped,
    unpublish,
)
from agentlightning.verl.verl_layout import INPUT_STATE_FILENAME, step_folder_name, step_of_folder

CONFIG_ENABLED = "agentlightning.async_rollout.enabled"
CONFIG_ASYNC_TRAIN_BATCH_SIZE = "agentlightning.async_rollout.async_train_batch_size"
DEFAULT_INPUT_ID_KEY = "input_id"

LEGACY_CHECKPOINT_WARNING = (
    "{folder} has no " + INPUT_STATE_FILENAME + " (written before the async input fix, or by a sync run): "
    "the buffered inputs of that checkpoint cannot be reconstructed, and the input epoch is guessed "
    "from the step as verl does. Inputs buffered when it was saved are skipped."
)
FORMAT_1_CHECKPOINT_WARNING = (
    "{path} was written in input checkpoint format version 1, which does not record in-flight rollouts: "
    "the buffered inputs, loader position and input epoch are restored exactly, but inputs whose rollouts "
    "were still running when it was saved (carried over to the next step) are not resubmitted and are "
    "never trained on."
)
NO_ROLLOUT_ENGINE_ERROR = (
    "AgentLightningRayPPOTrainer.fit() needs a rollout engine: set trainer.rollout_engine to an object "
    "implementing agentlightning.verl.rollout.RolloutEngine (agentlightning.verl.cpu_builder.build_cpu_trainer "
    "sets the CPU default)"
)


class AsyncRolloutConfigError(ValueError):
    """The ``agentlightning.async_rollout`` settings are inconsistent."""


class LegacyInputCheckpointWarning(UserWarning):
    """An async resume from a checkpoint without an input file: buffered inputs are lost."""


class InFlightInputsNotRecordedWarning(UserWarning):
    """A resume from a format version 1 input file: inputs in flight at that save are not trained on."""


@runtime_checkable
class InputObserver(Protocol):
    """Watches (and may steer the checkpointing of) a trainer; set as ``trainer.input_observer``.

    Every dataset item carries an integer id under ``trainer.input_id_key`` (``"input_id"`` by
    default); ids are reported as plain ints. Input epochs start at 0. When ``input_observer`` is None
    nothing is called.
    """

    def resumed(self, step: int, path: str | None) -> None:
        """Called once in ``fit()`` after loading: the step of the checkpoint actually restored and
        its folder (0 and None when starting fresh)."""

    def consumed(self, ids: list[int], step: int, epoch: int) -> None:
        """Ids taken from the input stream for training in ``step``, with the input epoch they belong
        to: async, at each refill in stream order (one call per epoch a refill spans); sync, the loader
        batch."""

    def trained(self, ids: list[int], step: int, epoch: int) -> None:
        """Ids whose rollouts were used in the update of ``step`` (one call per run of one epoch)."""

    def step_end(self, step: int) -> None:
        """After the update of ``step``, before any save of that step."""

    def should_checkpoint(self, step: int) -> bool:
        """Whether to save at the end of ``step``; the trainer saves if this is True *or* its own
        ``trainer.save_freq`` says so."""

    def checkpoint_published(self, step: int, path: str) -> None:
        """After the save of ``step`` completed (the tracker names it); ``path`` is its folder."""


@dataclass(frozen=True)
class AsyncRolloutSettings:
    """The ``agentlightning.async_rollout`` settings, validated."""

    enabled: bool
    async_train_batch_size: int | None


def read_async_settings(config: Any) -> AsyncRolloutSettings:
    """Read and validate ``agentlightning.async_rollout`` from a verl config (absent means sync)."""
    enabled = bool(OmegaConf.select(config, CONFIG_ENABLED, default=False))
    size = OmegaConf.select(config, CONFIG_ASYNC_TRAIN_BATCH_SIZE, default=None)
    if not enabled:
        return AsyncRolloutSettings(False, None if size is None else int(size))
    train_batch_size = int(config.data.train_batch_size)
    if size is None or int(size) <= train_batch_size:
        raise AsyncRolloutConfigError(
            f"{CONFIG_ASYNC_TRAIN_BATCH_SIZE}={size} must be greater than data.train_batch_size="
            f"{train_batch_size} when {CONFIG_ENABLED}=true; raise it (for example to "
            f"{train_batch_size + max(1, train_batch_size // 2)}) or set {CONFIG_ENABLED}=false"
        )
    return AsyncRolloutSettings(True, int(size))


def add_agentlightning_config(
    config: Any, *, enabled: bool, async_train_batch_size: int | None = None
) -> Any:
    """Add the ``agentlightning.async_rollout`` keys to ``config`` in place and return it.

    verl puts its config in OmegaConf struct mode, where unknown keys cannot be added later: call this
    before constructing the trainer.
    """
    with open_dict(config):
        config.agentlightning = {
            "async_rollout": {"enabled": bool(enabled), "async_train_batch_size": async_train_batch_size}
        }
    return config


class ObservedTrainingMixin:
    """Observer plumbing and the step pieces shared by the CPU-capable ``fit`` loops."""

    # From verl's RayPPOTrainer, which each class using this mixin also derives from (declared only:
    # a definition here would come before verl's in the method resolution order).
    config: Any
    actor_rollout_wg: Any
    _save_checkpoint: Callable[[], Any]

    input_observer: InputObserver | None
    input_id_key: str
    rollout_engine: RolloutEngine | None
    resumed_from: str | None
    in_flight_inputs: InFlightInputs

    def _init_observed_training(
        self, rollout_engine: RolloutEngine | None, input_observer: InputObserver | None, input_id_key: str
    ) -> None:
        self.rollout_engine = rollout_engine
        self.input_observer = input_observer
        self.input_id_key = input_id_key
        self.resumed_from = None
        self.last_metrics: dict[str, float] = {}
        self.in_flight_inputs = InFlightInputs()

    def _observe(self, event: str, *args: Any) -> Any:
        observer = self.input_observer
        if observer is None:
            return None
        return getattr(observer, event)(*args)

    def _require_engine(self) -> RolloutEngine:
        if self.rollout_engine is None:
            raise RuntimeError(NO_ROLLOUT_ENGINE_ERROR)
        return self.rollout_engine

    def step_folder(self, step: int) -> str:
        """Absolute path of the ``global_step_{step}`` folder under ``trainer.default_local_dir``."""
        base = os.path.abspath(self.config.trainer.default_local_dir)
        return os.path.join(base, step_folder_name(step))

    def _submit(self, batch: dict[str, Any], step: int, epoch: int) -> None:
        ids = ids_of(batch, self.input_id_key)
        self._observe("consumed", ids, step, epoch)
        # Recorded before the engine sees the batch: the record keeps the rows as taken from the stream.
        self.in_flight_inputs.add(batch, ids, epoch, step)
        self._require_engine().submit(batch, ids, epoch, step)

    def _train(self, done: CompletedRollouts | None, step: int) -> None:
        self.last_metrics = {}
        if done is not None:
            self.in_flight_inputs.complete(done.ids, done.epochs)
            self.last_metrics = self.actor_rollout_wg.update_actor(done.batch)
            for epoch, ids in done.by_epoch():
                self._observe("trained", ids, step, epoch)
        self._observe("step_end", step)

    def _save_if_due(self, step: int, is_last: bool) -> None:
        freq = self.config.trainer.save_freq
        due = freq > 0 and (is_last or step % freq == 0)  # verl's rule in RayPPOTrainer.fit
        if self._observe("should_checkpoint", step):
            due = True
        if due:
            self._save_checkpoint()
            self._observe("checkpoint_published", step, self.step_folder(step))


class AgentLightningRayPPOTrainer(ObservedTrainingMixin, RayPPOTrainer):
    """verl's ``RayPPOTrainer`` with async input refills whose position survives checkpoint and resume.

    Extra keyword arguments: ``rollout_engine`` (a :class:`~agentlightning.verl.rollout.RolloutEngine`),
    ``input_observer`` (an :class:`InputObserver`) and ``input_id_key`` (the batch field holding each
    input's integer id). All three can also be set as attributes after construction.
    """

    def __init__(
        self,
        config: Any,
        *args: Any,
        rollout_engine: RolloutEngine | None = None,
        input_observer: InputObserver | None = None,
        input_id_key: str = DEFAULT_INPUT_ID_KEY,
        **kwargs: Any,
    ) -> None:
        # Validate before verl's constructor builds loaders: a bad setting should fail fast.
        self.async_settings = read_async_settings(config)
        super().__init__(config, *args, **kwargs)
        self._init_observed_training(rollout_engine, input_observer, input_id_key)
        self.input_stream = BufferedInputStream(self.train_dataloader, self.config.trainer.total_epochs)

    @property
    def async_enabled(self) -> bool:
        """True when ``agentlightning.async_rollout.enabled`` is set."""
        return self.async_settings.enabled

    def _save_checkpoint(self) -> None:
        """verl's save, made durable, preceded in async mode by the input file; publishes the tracker last.

        Order (see :mod:`agentlightning.verl.verl_checkpoint`): the input file (async, atomic), the actor
        and critic through the worker groups, ``data.pt`` (verl's bytes, then fsynced with its folder),
        and last the tracker, atomically. A kill at any point leaves the tracker naming the previous
        complete checkpoint or this one. If any step raises, the tracker is left naming the previous
        checkpoint (put back if only the fsync after its replacement failed), the input file and
        ``data.pt`` of this folder are removed so no resume takes it for complete, and the exception
        propagates.
        """
        step = self.global_steps
        folder = save_folder(self.config, step)
        previous_tracker = read_tracker_bytes(self.config)
        try:
            if self.async_enabled:
                self._save_input_file(folder, step)
            save_worker_checkpoints(self, folder, step)
            save_data_state(self.train_dataloader, folder)
            if not tracker_skipped(self.config):
                publish_tracker(self.config, step)
        except BaseException:
            unpublish(self.config, folder, step, previous_tracker)
            raise

    def _save_input_file(self, folder: str, step: int) -> None:
        """Write the input file of ``step`` into ``folder``: the input stream's position and buffered
        tail, and the groups still in flight (async mode, first thing in a save)."""
        write_input_state(folder, step, self.input_stream.state_dict(), self.in_flight_inputs.state_dict())

    def _load_checkpoint(self) -> Any:
        """Choose the folder to resume from, load verl's state from it, then the exact input position and
        the carried-over groups (from the input file when there is one).

        The folder is chosen and checked by :func:`~agentlightning.verl.resume_selection.choose_resume_folder`
        (tracker, completeness, fallback with a warning, typed errors) and its input file is validated
        before anything is loaded, so a bad checkpoint stops the resume before any state changes. The
        rollout engine is reset and the groups in flight at the save are resubmitted (see
        :meth:`_resubmit_carried_over`). Sets ``self.resumed_from``; returns 0 for a fresh start, like
        verl.
        """
        self.resumed_from = None
        self.in_flight_inputs.clear()
        if self.rollout_engine is not None:
            self.rollout_engine.reset()
        if self.config.trainer.resume_mode != "disable" and self.config.trainer.default_hdfs_dir is not None:
            raise NotImplementedError("load from hdfs is not implemented yet")  # as verl
        choice = choose_resume_folder(self.config, async_enabled=self.async_enabled, use_critic=self.use_critic)
        if choice.folder is None:
            self.input_stream.restore_position(0, 0)
            return 0
        folder, checkpoint = choice.folder, choice.checkpoint
        self.global_steps = step_of_folder(folder)
        load_worker_checkpoints(self, folder)
        self.resumed_from = folder
        if checkpoint is not None:
            # The input file's loader state is authoritative: data.pt is not read at all.
            self.input_stream.load_state_dict(checkpoint.stream)
            self._resubmit_carried_over(checkpoint)
        elif self.async_enabled:
            self._restore_legacy_async_position(folder)
        else:
            self._restore_sync_position(folder)
        return None

    def _resubmit_carried_over(self, checkpoint: InputCheckpoint) -> None:
        # The groups are resubmitted before anything else and with the step they were first submitted
        # in, so the engine holds them in the uninterrupted run's order and (for the deterministic
        # engine) finishes each at the same step. They are not reported as consumed again: that happened
        # in the step that first took them, which the checkpoint covers.
        if not checkpoint.records_carried_over:
            message = FORMAT_1_CHECKPOINT_WARNING.format(path=checkpoint.path)
            warnings.warn(message, InFlightInputsNotRecordedWarning, stacklevel=4)
            return
        assert checkpoint.carried_over is not None
        self._restore_in_flight(checkpoint.carried_over)

    def _restore_in_flight(self, carried_over: dict[str, Any]) -> None:
        """Load the in-flight record of the input file and resubmit its groups to the rollout engine."""
        self.in_flight_inputs.load_state_dict(carried_over)
        engine = self._require_engine()
        for call in self.in_flight_inputs.resubmissions():
            engine.submit(call.batch, call.ids, call.epoch, call.step)

    def _restore_legacy_async_position(self, folder: str) -> None:
        # What the trainer did before the fix: verl's data.pt handling (skipped at a step divisible by
        # the loader length) and verl's step-based epoch guess.
        message = LEGACY_CHECKPOINT_WARNING.format(folder=folder)
        warnings.warn(message, LegacyInputCheckpointWarning, stacklevel=3)
        per_epoch = len(self.train_dataloader)
        step = self.global_steps
        at_boundary = per_epoch > 0 and step % per_epoch == 0
        if not at_boundary:
            self.train_dataloader.load_state_dict(load_data_state(folder))
        self.input_stream.restore_position(step // per_epoch, 0 if at_boundary else step % per_epoch)

    def _restore_sync_position(self, folder: str) -> None:
        # In sync mode one step is one loader batch, so the step gives the position exactly. verl skips
        # data.pt at an epoch boundary and restarts the loader, which with shuffling replays the first
        # epoch's order; restoring it always (an exhausted state yields one empty pass, which the
        # stream counts as the end of the saved epoch) keeps the shuffle order.
        per_epoch = len(self.train_dataloader)
        step = self.global_steps
        if step > 0:
            self.train_dataloader.load_state_dict(load_data_state(folder))
            self.input_stream.restore_position((step - 1) // per_epoch, (step - 1) % per_epoch + 1)
        else:
            self.input_stream.restore_position(0, 0)

    def fit(self) -> None:
        """Train until the input stream is exhausted (or ``trainer.total_training_steps``), saving as due.

        Each step: refill (async: ``async_train_batch_size`` minus the carried-over groups, never past
        ``trainer.total_epochs``; sync: one loader batch), submit the new inputs to the rollout engine,
        update the actor on the finished rollouts (async: those ready by the end of the step; sync:
        all), then save if due. The last step is the one that trains the last admitted input.
        """
        engine = self._require_engine()
        self.global_steps = 0
        self._load_checkpoint()
        self._observe("resumed", self.global_steps, self.resumed_from)
        cap = self.config.trainer.get("total_training_steps", None)
        self.global_steps += 1
        while cap is None or self.global_steps <= cap:
            step = self.global_steps
            if self.async_enabled:
                window = self.async_settings.async_train_batch_size
                assert window is not None  # read_async_settings requires it when async is enabled
                # The carried-over groups (resubmitted ones included) count against the window.
                wanted = window - len(self.in_flight_inputs)
            else:
                wanted = self.train_dataloader.batch_size
            chunks = self.input_stream.take(max(0, wanted))
            if not chunks and not self.in_flight_inputs:
                break  # nothing left: the previous step was the last one
            for chunk in chunks:
                self._submit(chunk.batch, step, chunk.epoch)
            self._train(engine.collect(step) if self.async_enabled else engine.drain(step), step)
            is_last = (self.input_stream.remaining() == 0 and not self.in_flight_inputs) or (
                cap is not None and step >= cap
            )
            self._save_if_due(step, is_last)
            self.global_steps += 1
            if is_last:
                break
