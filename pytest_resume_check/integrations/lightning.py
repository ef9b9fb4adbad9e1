"""PyTorch Lightning: one callback makes a ``Trainer.fit`` a resume-check target.

:class:`LightningResumeCheck` is a Lightning :class:`~lightning.pytorch.callbacks.Callback`. Given the run context
and a function that reads the input ids of a batch, it reports what the harness judges:

* each training batch as consumed when it starts (``on_train_batch_start``), for the optimizer step it
  feeds (``trainer.global_step + 1``) and the trainer's epoch;
* the end of a step only when an optimizer step happened (``trainer.global_step`` moved), so under
  ``accumulate_grad_batches=k`` a step takes ``k`` batches (fewer at the end of an epoch, as Lightning
  steps on an epoch's last batch);
* a checkpoint when the harness asks for one, written with Lightning's own ``trainer.save_checkpoint``
  to a temporary name, synced, and renamed to ``step_N.ckpt``; published only once it is in place;
* the checkpoint Lightning actually restored: ``trainer.ckpt_path``, the file the trainer's own code passed to
  ``trainer.fit(ckpt_path=...)`` (its own "which checkpoint" logic, which the matrix tests: an older file than
  the newest the harness published fails as ``STALE_RESUME``), and ``trainer.global_step`` when training starts;
* after a resume, the state Lightning restored, in ``on_train_start``: Lightning calls it once the
  checkpoint's module, optimizers, LR schedulers and loops are restored and the loader's position is
  loaded, before the first batch (the fit loop only when it reads as the checkpoint left it, see
  :meth:`LightningResumeCheck.restored_state`);
* the training state after each step: the LightningModule, the optimizers, the LR schedulers and the
  fit loop (its progress counters and the state of stateful data loaders);
* what the fit delivers, the LightningModule, as the final outputs (``run.final``) when the fit ends
  (``on_fit_end``).

:class:`EpochEndResumeFix` is a separate callback for the user's own trainer (with or without the
harness): it works around a Lightning 2.6 bug by which a fit resumed from a checkpoint written at the
last batch of an epoch skips the next epoch when the train loader is stateful (docs/findings.md).

The callback never chooses the checkpoint: the trainer's code does, as it does outside the harness (it
finds the ``step_N.ckpt`` files this callback writes in ``run.checkpoint_dir``). For a trainer with no resume
logic of its own, :meth:`LightningResumeCheck.ckpt_path` is a helper that chooses under the run's resume mode.
``keep_last=N`` deletes all but the newest ``N`` checkpoints, as trainers that keep the last few do.

Lightning is imported at the top: this module is only imported where Lightning is installed. Importing
it defines things and does nothing else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from pytest_resume_check.integrations.durable import fsync_path
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext

__all__ = ["CHECKPOINT_PATTERN", "EpochEndResumeFix", "LightningResumeCheck", "checkpoint_name", "checkpoints_in"]

#: Checkpoints this callback writes are named ``step_N.ckpt`` (N: the optimizer step, ``trainer.global_step``).
CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)\.ckpt$")
#: A checkpoint being written: hidden, and never matched by :data:`CHECKPOINT_PATTERN`.
PARTIAL_SUFFIX = ".partial"

#: The state components :meth:`LightningResumeCheck.training_state` reports.
STATE_MODEL = "model"
STATE_OPTIMIZERS = "optimizers"
STATE_LR_SCHEDULERS = "lr_schedulers"
STATE_FIT_LOOP = "fit_loop"
#: Settings reported when training starts (``run.settings``): whether every train loader is stateful (has
#: ``state_dict`` and ``load_state_dict``, so Lightning saves and restores its position; None when the fit has
#: none) and whether :class:`EpochEndResumeFix` is among the trainer's callbacks. The report's known findings
#: read them: the epoch-end bug needs a stateful loader and no fix (docs/findings.md).
SETTING_STATEFUL_LOADER = "stateful_train_loader"
SETTING_EPOCH_END_FIX = "epoch_end_fix"

ERR_IDS_NOT_CALLABLE = ("LightningResumeCheck(run, ids=...): ids must be a function of a batch that returns the ids of "
                        "its inputs in order, e.g. ids=lambda batch: batch['input_id']; got {got!r}")
ERR_IDS_RAISED = ("LightningResumeCheck: ids(batch) raised {error} on a {kind} batch{keys}; pass ids= a function that "
                  "returns the ids of the batch's inputs, e.g. ids=lambda batch: batch['input_id'] (wrap the dataset "
                  "in pytest_resume_check.WithIds to add them)")
ERR_IDS_NOT_SEQUENCE = ("LightningResumeCheck: ids(batch) returned a {kind}, not a sequence of ids (one per input); "
                        "return e.g. batch['input_id'] (a tensor or list)")
ERR_KEEP_LAST = ("LightningResumeCheck(keep_last={got!r}): keep_last must be a whole number of at least 1, or None "
                 "to keep all")
ERR_RESUME_PATH = ("LightningResumeCheck.ckpt_path(): resume mode 'path' names {path}, which is not a checkpoint file; "
                   "the harness passes the path this callback published (step_N.ckpt)")


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: ``step_5.ckpt``."""
    return f"step_{int(step)}.ckpt"


def checkpoints_in(folder: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of this callback in ``folder``, as (step, path), oldest first. A save that
    was killed left only a hidden partial file, which is not listed."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_file()]
    return sorted(found)


class LightningResumeCheck(Callback):
    """Reports a Lightning ``Trainer.fit`` to the harness and checkpoints when the harness asks.

    Args:
        run: the run context the target function received.
        ids: a function of a training batch (as ``training_step`` gets it) returning the ids of its
            inputs in order: a tensor, array or list, e.g. ``lambda batch: batch["input_id"]``.
        keep_last: keep only the newest ``keep_last`` checkpoints in ``run.checkpoint_dir``
            (``step_N.ckpt``), deleting older ones after each save; ``None`` keeps all.
        report_state: report the training state after each step and right after a resume
            (``run.state``), so a resume that forgets part of it fails as ``STATE_DIVERGED``. Turn it off
            only for very large models.
        report_final: report the trained LightningModule when the fit ends (``run.final``), so a
            resumed fit that delivers another model than an uninterrupted one fails. A target that
            reports final outputs is never stopped early: its last run trains to the end.

    Steps are optimizer steps as Lightning counts them (``trainer.global_step``), one per optimizer
    step of automatic optimization.
    """

    def __init__(self, run: RunContext, ids: Callable[[Any], Iterable[Any]], *, keep_last: int | None = None,
                 report_state: bool = True, report_final: bool = True):
        if not callable(ids):
            raise TypeError(ERR_IDS_NOT_CALLABLE.format(got=ids))
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(ERR_KEEP_LAST.format(got=keep_last))
        self.run = run
        self.ids = ids
        self.keep_last = keep_last
        self.report_state = report_state
        self.report_final = report_final
        self._step_at_batch_start: int | None = None
        self._resume_reported = False

    # -- a helper for a trainer with no resume logic of its own ---------------------------------------
    def ckpt_path(self) -> str | None:
        """A checkpoint for ``trainer.fit(..., ckpt_path=...)`` when the trainer has no resume logic of its
        own, chosen under the run's resume mode: the newest ``step_N.ckpt`` in ``run.checkpoint_dir`` by step
        (``auto``), ``run.resume_path`` (``path``), or ``None`` to start fresh (``disabled``, or ``auto`` with
        no checkpoint yet). A trainer that chooses its checkpoint itself should keep doing so under the
        matrix, which then tests that choice; this callback reports whatever Lightning restored."""
        mode = self.run.resume_mode
        if mode == RESUME_DISABLED:
            return None
        if mode == RESUME_PATH:
            path = self.run.resume_path
            if path is None or not path.is_file():
                raise FileNotFoundError(ERR_RESUME_PATH.format(path=path))
            return str(path)
        assert mode == RESUME_AUTO, mode
        found = checkpoints_in(self.run.checkpoint_dir)
        return str(found[-1][1]) if found else None

    # -- Lightning hooks --------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Report the restored step and, after a resume, the restored state, before any batch."""
        self._report_resumed(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Report what the fit delivers. A fit whose checkpoint already reached ``max_steps`` trains
        nothing and never calls ``on_train_start``: its restored step is reported here."""
        self._report_resumed(trainer)
        if self.report_final:
            self.run.final({STATE_MODEL: trainer.lightning_module})

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """The batch is taken for training: it feeds the next optimizer step."""
        self._step_at_batch_start = trainer.global_step
        self.run.consumed(self._batch_ids(batch), step=trainer.global_step + 1, epoch=trainer.current_epoch)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """If the optimizer stepped: end the step, checkpoint if asked, report the state."""
        step = trainer.global_step
        if self._step_at_batch_start is None or step == self._step_at_batch_start:
            return  # gradients were accumulated: the step goes on with the next batch
        self._step_at_batch_start = None
        self.run.step_end(step)
        if self.run.should_checkpoint(step):
            self.save(trainer, step)
        if self.report_state:
            self.run.state(step, self.training_state(trainer))

    # -- checkpoints and state ---------------------------------------------------------------------
    def save(self, trainer: Trainer, step: int) -> Path:
        """Write ``run.checkpoint_dir/step_N.ckpt`` with ``trainer.save_checkpoint`` so that it exists
        complete or not at all, publish it, then delete what ``keep_last`` no longer keeps."""
        folder = self.run.checkpoint_dir
        final = folder / checkpoint_name(step)
        partial = folder / ("." + final.name + PARTIAL_SUFFIX)
        trainer.save_checkpoint(partial)
        fsync_path(partial)  # Lightning's own write never syncs the data
        os.replace(partial, final)
        fsync_path(folder)  # the rename itself survives a power loss
        self.run.checkpoint_published(step, final)
        if self.keep_last is not None:
            for _, old in checkpoints_in(folder)[: -self.keep_last]:
                old.unlink(missing_ok=True)
        return final

    def training_state(self, trainer: Trainer) -> dict[str, Any]:
        """The state that decides the rest of the fit: module, optimizers, LR schedulers and the fit
        loop's ``state_dict()`` (epoch and batch progress, stateful loaders' positions)."""
        return {
            STATE_MODEL: trainer.lightning_module,
            STATE_OPTIMIZERS: list(trainer.optimizers),
            STATE_LR_SCHEDULERS: [config.scheduler for config in trainer.lr_scheduler_configs],
            STATE_FIT_LOOP: trainer.fit_loop.state_dict(),
        }

    def restored_state(self, trainer: Trainer) -> dict[str, Any]:
        """The state a resumed fit reports at the restored step: :meth:`training_state`, without the fit
        loop unless the checkpoint was written after a batch inside an epoch (``on_train_batch_end``, where
        this callback saves). There the loop reads, before the first resumed batch, exactly as after that
        step of an uninterrupted fit (Lightning completes the batch's counters only when the epoch loop
        starts). After an epoch's last batch it does not: ``_FitLoop.reset`` counts the finished epoch as
        processed and completed before ``on_train_start``, which an uninterrupted fit does only after
        ``on_train_batch_end`` of that batch; and a checkpoint written at another point of the loop (an
        epoch's start or end) is adjusted other ways. Those differences are by design, and the loop is
        compared from the first step after the resume on."""
        state = self.training_state(trainer)
        epoch_loop = trainer.fit_loop.epoch_loop
        if not (epoch_loop.restarted_on_train_batch_end and not epoch_loop.batch_progress.is_last_batch):
            del state[STATE_FIT_LOOP]
        return state

    # -- helpers ----------------------------------------------------------------------------------
    def _report_resumed(self, trainer: Trainer) -> None:
        if self._resume_reported:
            return
        self._resume_reported = True
        callbacks = getattr(trainer, "callbacks", [])  # set in Trainer.__init__ by its connector: untyped
        self.run.settings({SETTING_STATEFUL_LOADER: _stateful_train_loader(trainer),
                           SETTING_EPOCH_END_FIX: any(isinstance(cb, EpochEndResumeFix) for cb in callbacks)})
        path = trainer.ckpt_path  # what Lightning restored, whoever chose it (None when it started fresh)
        self.run.resumed(trainer.global_step, str(path) if path else None)
        if path and self.report_state:
            self.run.state(trainer.global_step, self.restored_state(trainer))

    def _batch_ids(self, batch: Any) -> list[Any]:
        try:
            ids = self.ids(batch)
        except Exception as error:  # the user's function: say what it was given
            keys = f" with keys {sorted(map(str, batch))[:8]}" if isinstance(batch, Mapping) else ""
            raise ValueError(ERR_IDS_RAISED.format(error=f"{type(error).__name__}: {error}",
                                                   kind=type(batch).__name__, keys=keys)) from error
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(ERR_IDS_NOT_SEQUENCE.format(kind=type(ids).__name__))
        return list(ids)


class EpochEndResumeFix(Callback):
    """Opt-in workaround for a Lightning 2.6 bug, for the user's own trainer: resumed from a checkpoint
    written in ``on_train_batch_end`` of an epoch's last batch (where ``ModelCheckpoint(every_n_train_steps=
    ...)`` and :class:`LightningResumeCheck` save), ``Trainer.fit`` counts that epoch as done but keeps the loader
    iterator it made before, which resumes the finished epoch: a stateful loader (torchdata
    ``StatefulDataLoader``) yields nothing and the whole next epoch is skipped, and ``on_train_epoch_start``
    is not called for it (docs/findings.md, "Lightning: a checkpoint at an epoch's last batch skips the
    next epoch").

    When training starts after such a resume, this callback starts the next epoch the way an uninterrupted
    fit does: it lets the fit loop count the epoch as started (calling ``on_train_epoch_start``), sets the
    samplers' epoch and makes a fresh loader iterator. It touches Lightning internals (``fit_loop``'s
    restart stage and data fetcher), checked against Lightning 2.6.6, and does nothing on any other resume.
    Adding :class:`LightningResumeCheck` alone changes nothing about this bug: the harness reports it.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if _resumed_after_last_batch(trainer):
            _start_next_epoch(trainer)


def _stateful_train_loader(trainer: Trainer) -> bool | None:
    """Whether every train loader of the fit is stateful as Lightning counts it (``state_dict`` and
    ``load_state_dict``: the fit loop saves and restores its position); None when the fit has no loader."""
    combined = trainer.fit_loop._combined_loader
    loaders = list(combined.flattened) if combined is not None else []
    if not loaders:
        return None
    return all(callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
               for loader in loaders)


def _resumed_after_last_batch(trainer: Trainer) -> bool:
    """Lightning restored a checkpoint written in ``on_train_batch_end`` of an epoch's last batch and has
    moved its counters to the next epoch (``_FitLoop.reset``), yet the loader iterator it made in
    ``setup_data`` resumes the finished epoch and yields nothing."""
    loop = trainer.fit_loop
    return bool(loop.restarted_mid_epoch and loop.epoch_loop.restarted_on_train_batch_end
                and loop.epoch_loop.batch_progress.is_last_batch and not loop.done
                and loop._combined_loader is not None and loop._data_fetcher is not None)


def _start_next_epoch(trainer: Trainer) -> None:
    """Start the next epoch as an uninterrupted fit does: clear the fit loop's "restarted mid-epoch" stage,
    so that it counts the epoch as started and calls ``on_train_epoch_start``, and make a fresh loader
    iterator for it (the samplers' epoch set first), so that a stateful loader starts its next epoch."""
    loop = trainer.fit_loop
    assert loop._combined_loader is not None and loop._data_fetcher is not None  # checked by the caller
    loop.reset_restart_stage()
    for loader in loop._combined_loader.flattened:
        _set_sampler_epoch(loader, trainer.current_epoch)
    iter(loop._data_fetcher)
