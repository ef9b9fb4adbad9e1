"""Hugging Face Transformers ``Trainer`` as a resume-check target: one ``TrainerCallback``.

In a target function, give the callback to the ``Trainer`` and resume the way the job does outside the
harness, with its own choice of checkpoint under the run's resume mode::

    check = HFTrainerResumeCheck(run)
    args = TrainingArguments(output_dir=str(run.checkpoint_dir), seed=run.seed,
                             remove_unused_columns=False, ...)
    trainer = Trainer(model, args, train_dataset=WithIds(dataset), callbacks=[check])
    resume = {"auto": my_last_checkpoint(args.output_dir), "path": run.resume_path}.get(run.resume_mode)
    trainer.train(resume_from_checkpoint=resume)     # the job's own "which checkpoint" code runs

The callback never chooses the checkpoint: it reports the one the Trainer restored, and the harness judges
whether it was the newest one published (an older one is ``STALE_RESUME``). For a job with no resume logic
of its own, :func:`checkpoint_to_resume` (also :attr:`HFTrainerResumeCheck.resume_from_checkpoint`) is a helper that
chooses.

Where each report comes from in the Trainer's loop (transformers 5.x ``Trainer._inner_training_loop``):

* ``resumed``: in ``on_train_begin``, with ``state.global_step``, the step the Trainer actually restored
  (0 when it started fresh), so a resume argument that never reached ``train()`` shows as a stale resume,
  and the folder of that step (the Trainer does not tell its callbacks which folder it loaded:
  ``run.resume_path`` if it holds that step, else ``checkpoint-<step>`` in the output directory).
* ``consumed``: callbacks never see a batch, and the train dataloader is the wrong place to look: the
  Trainer replaces it with a new ``skip_first_batches`` loader in the first epoch of a resumed run, and with
  ``dataloader_num_workers > 0`` the collator runs in worker processes. So the callback puts a forward
  pre-hook on the model: every micro-batch the Trainer trains on passes through ``model(**inputs)`` in the
  main process, after any skipping. The hook takes the id key out of the inputs (the model never sees it)
  and reports the ids for step ``state.global_step + 1``, the optimizer step the micro-batch feeds (so
  ``gradient_accumulation_steps`` micro-batches report one step), with the epoch the Trainer is in.
* ``step_end``: in ``on_step_end``, which the Trainer calls once per optimizer step.
* ``should_checkpoint``: also in ``on_step_end``; it sets ``control.should_save``, and the Trainer saves
  ``checkpoint-N`` right after. The Trainer's own ``save_strategy`` saves are published too.
* ``checkpoint_published``: in ``on_save``, which runs after ``Trainer._save_checkpoint`` returned (model,
  optimizer, scheduler, RNG state and ``trainer_state.json`` written, old checkpoints rotated out). The files
  are fsynced first, because the Trainer writes them in place and never syncs.
* ``state``: after each optimizer step (after the step's save, if it has one): the step's batches as the
  model got them (``batch``: a collator that draws random masks shows there, with the ids unchanged), model,
  optimizer, LR scheduler, the Python, NumPy and torch RNGs, and the trainer state that a checkpoint
  restores. After a resume, also at the restored step in ``on_train_begin``, which the Trainer calls once it
  has loaded the model, the optimizer, the LR scheduler and ``trainer_state.json``: those components,
  without the RNGs (see :meth:`HFTrainerResumeCheck.restored_state`).
* ``settings``: in ``on_train_begin``, ``dataloader_num_workers`` (:data:`SETTING_WORKERS`), which the report
  reads before it names the Trainer's own finding about collated batches (docs/findings.md).
* ``final``: the model the Trainer trained, in ``on_train_end`` (after ``load_best_model_at_end`` loaded
  the best one, if asked), as what the job delivers (``report_final=False`` turns it off).

Importing this module imports ``transformers`` and defines things; nothing runs until a callback is used.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from pytest_resume_check.ids import DEFAULT_ID_KEY
from pytest_resume_check.integrations.durable import sync_tree
from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

__all__ = ["CHECKPOINT_FOLDER", "HFTrainerResumeCheck", "TRAINER_STATE_FILE", "checkpoint_step",
           "checkpoint_to_resume", "is_complete", "latest_checkpoint"]

#: The file ``Trainer._save_checkpoint`` writes last into ``checkpoint-N`` (before rotating old ones out):
#: a folder without it is a save that was cut short, and is never chosen for resume.
TRAINER_STATE_FILE = "trainer_state.json"
#: A checkpoint folder of the Trainer: ``checkpoint-<global step>``.
CHECKPOINT_FOLDER = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
#: State components besides the Trainer's objects (``model``, ``optimizer``, ``lr_scheduler``).
STATE_MODEL, STATE_RNG, STATE_TRAINER = "model", "rng", "trainer_state"
#: The inputs the model was called with in a step (each micro-batch, the id key taken out), a state component:
#: the ids say which examples a step took, this says what the collator made of them (masks drawn at random).
STATE_BATCH = "batch"
#: The setting reported when training begins (``run.settings``): the Trainer's loader workers. With none, the
#: collator runs in the main process and draws from the RNG the Trainer restores (docs/findings.md); the
#: report's known findings read it.
SETTING_WORKERS = "dataloader_num_workers"
#: The fields of ``TrainerState`` that a checkpoint restores and that decide the rest of the run.
#: Not ``total_flos`` or ``log_history``: the Trainer adds to them only when it saves or logs, so they
#: depend on the save schedule, which differs between an interrupted run and the uninterrupted one.
TRAINER_STATE_FIELDS = ("global_step", "epoch", "max_steps", "num_train_epochs", "num_input_tokens_seen",
                        "best_metric", "best_global_step")

ERR_RUN = ("HFTrainerResumeCheck(run): got a {type}, not the run context; pass the `run` your target function "
           "receives, e.g. HFTrainerResumeCheck(run)")
ERR_IDS = ("HFTrainerResumeCheck(ids=...): got a {type}; give the batch key that holds the ids (a str, default "
           f"{DEFAULT_ID_KEY!r}) or a function of the batch that returns one id per example")
ERR_OUTPUT_DIR = ("HFTrainerResumeCheck: TrainingArguments.output_dir is {output_dir}, but this run keeps its "
                  "checkpoints in {checkpoint_dir}; pass TrainingArguments(output_dir=str(run.checkpoint_dir))")
ERR_REMOVE_COLUMNS = ("HFTrainerResumeCheck(ids={key!r}): TrainingArguments(remove_unused_columns=True) drops the "
                      "{key!r} column before the model sees it; pass remove_unused_columns=False (HFTrainerResumeCheck "
                      "takes the key out of the model's inputs) or give ids= a function of the batch")
ERR_NO_ID_KEY = ("HFTrainerResumeCheck(ids={key!r}): the training batch has no {key!r} key (keys: {keys}); wrap the "
                 "dataset in pytest_resume_check.WithIds (or name its id column with ids=) and keep the key in the "
                 "collator's output")
ERR_IDS_RAISED = ("HFTrainerResumeCheck: the ids function raised {error} on a batch with keys {keys}; fix the function "
                  "given as ids=")
ERR_IDS_COUNT = ("HFTrainerResumeCheck: the ids function returned {count} ids for a batch of {size} examples (keys: "
                 "{keys}); it must return one id per example, e.g. ids=lambda batch: batch['idx']")
ERR_RESUME_PATH = ("resume path {path} is not a complete Trainer checkpoint (no {file}); give a checkpoint-N folder "
                   "that Trainer saved")
ERR_SAVE_INCOMPLETE = ("HFTrainerResumeCheck: on_save for step {step}, but {folder} has no {file}; the Trainer's save "
                       "did not finish (a save_checkpoint override, or a hyperparameter search's run folder)")


def checkpoint_step(folder: str | os.PathLike[str]) -> int | None:
    """The global step of a ``checkpoint-N`` folder (None for any other name)."""
    match = CHECKPOINT_FOLDER.match(Path(folder).name)
    return int(match.group(1)) if match else None


def is_complete(folder: str | os.PathLike[str]) -> bool:
    """True if the Trainer finished writing this checkpoint folder (it holds ``trainer_state.json``)."""
    return (Path(folder) / TRAINER_STATE_FILE).is_file()


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The complete ``checkpoint-N`` folder of ``output_dir`` with the highest step, or None.

    Unlike ``transformers.trainer_utils.get_last_checkpoint``, a folder whose save was cut short (no
    ``trainer_state.json`` yet) is skipped instead of chosen.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if checkpoint_step(p) is not None and p.is_dir() and is_complete(p)]
    return max(done, key=lambda p: checkpoint_step(p) or 0, default=None)


def checkpoint_to_resume(run: RunContext) -> Path | None:
    """A helper for a job with no resume logic of its own: the checkpoint ``run.resume_mode`` selects, ``auto``
    the latest complete one in ``run.checkpoint_dir`` (None there: a fresh start), ``path`` exactly
    ``run.resume_path`` (which must be complete), ``disabled`` None. A job that chooses its checkpoint itself
    should keep doing so under the matrix, which then tests that choice."""
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:
        if run.resume_path is None or not is_complete(run.resume_path):
            raise FileNotFoundError(ERR_RESUME_PATH.format(path=run.resume_path, file=TRAINER_STATE_FILE))
        return run.resume_path
    return latest_checkpoint(run.checkpoint_dir)


def recorded_step(folder: str | os.PathLike[str]) -> int | None:
    """The ``global_step`` a checkpoint folder's ``trainer_state.json`` records (None: no readable file)."""
    try:
        step = json.loads((Path(folder) / TRAINER_STATE_FILE).read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def rng_state() -> dict[str, Any]:
    """The global RNGs a Trainer checkpoint saves and restores (``rng_state.pth``) on CPU."""
    return {"python": repr(random.getstate()), "numpy": list(np.random.get_state()), "torch": torch.get_rng_state()}


class HFTrainerResumeCheck(TrainerCallback):
    """A ``TrainerCallback`` that reports a ``Trainer``'s training to the run context.

    ``run``: the ``RunContext`` the target function receives. The callback does not choose the checkpoint
    to resume from: the job's code does, and the callback reports what the Trainer restored
    (:attr:`resume_from_checkpoint` is a helper for a job with no resume logic of its own).

    ``ids``: where the input ids are. A batch key (default ``"input_id"``, the key
    ``pytest_resume_check.WithIds`` adds): it needs ``TrainingArguments(remove_unused_columns=False)``, and
    the callback takes the key out of the model's inputs, so the model and the loss never see it. Or a
    function of the batch (the dict the model is called with) returning one id per example, e.g.
    ``lambda batch: batch["idx"]``; the batch is then left as it is.

    ``extra_state``: optional, a function returning more state components to report after each step
    (``{"sampler": my_sampler}``): whatever the run depends on that is not the Trainer's.

    ``durable``: fsync a checkpoint's files before publishing it (default True; the Trainer does not).

    ``report_final``: report the trained model in ``on_train_end`` as what the job delivers (``run.final``,
    default True), so a resumed job that ends with another model than an uninterrupted one fails. A target
    that reports final outputs is never stopped early: its last run trains to the end.
    """

    def __init__(self, run: RunContext, ids: str | Callable[[Mapping[str, Any]], Iterable[Any]] = DEFAULT_ID_KEY,
                 *, extra_state: Callable[[], Mapping[str, Any]] | None = None, durable: bool = True,
                 report_final: bool = True):
        if not all(hasattr(run, name) for name in ("consumed", "step_end", "resume_mode")):
            raise TypeError(ERR_RUN.format(type=type(run).__name__))
        if not (isinstance(ids, str) or callable(ids)):
            raise TypeError(ERR_IDS.format(type=type(ids).__name__))
        self.run = run
        self.ids = ids
        self.extra_state = extra_state
        self.durable = durable
        self.report_final = report_final
        self._state: TrainerState | None = None
        self._objects: dict[str, Any] = {}
        self._hook: Any = None
        self._first_epoch = 0
        self._epoch: int | None = None
        self._state_due: int | None = None  # a step whose state is reported after its save
        self._extra_due: int | None = None  # a restored step whose extra_state is reported at the first batch
        self._batches: list[dict[str, Any]] = []  # the model's inputs in the step under way, by micro-batch

    @property
    def resume_from_checkpoint(self) -> str | None:
        """A helper for a job with no resume logic of its own: the folder :func:`checkpoint_to_resume` chooses,
        for ``trainer.train(resume_from_checkpoint=...)`` (None: start fresh)."""
        folder = checkpoint_to_resume(self.run)
        return str(folder) if folder is not None else None

    # -- Trainer events ----------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Check the arguments, report the restored step and state, and start watching the model's inputs."""
        if _output_dir(args).resolve() != self.run.checkpoint_dir.resolve():
            raise ValueError(ERR_OUTPUT_DIR.format(output_dir=args.output_dir, checkpoint_dir=self.run.checkpoint_dir))
        if isinstance(self.ids, str) and args.remove_unused_columns:
            raise ValueError(ERR_REMOVE_COLUMNS.format(key=self.ids))
        self._state = state
        self._objects = {name: kwargs.get(name) for name in ("model", "optimizer", "lr_scheduler")}
        self._batches = []
        self.run.settings({SETTING_WORKERS: int(args.dataloader_num_workers)})
        step = int(state.global_step)
        self.run.resumed(step, self._restored_folder(args, step))
        if step:
            self.run.state(step, self.restored_state())
            self._extra_due = step if self.extra_state is not None else None
        per_epoch = _updates_per_epoch(kwargs.get("train_dataloader"), args.gradient_accumulation_steps)
        self._first_epoch = step // per_epoch if per_epoch else int(state.epoch or 0)
        self._epoch = None
        if step and args.ignore_data_skip:
            self.run.log(f"TrainingArguments(ignore_data_skip=True): the Trainer restarts epoch "
                         f"{self._first_epoch} from its first batch instead of skipping what step {step} trained on")
        model = kwargs["model"]
        self._hook = model.register_forward_pre_hook(self._take_ids, with_kwargs=True)

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Count epochs the Trainer's way: the first one of a resumed run is ``global_step // updates per epoch``."""
        self._epoch = self._first_epoch if self._epoch is None else self._epoch + 1

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        """Report a state still due (a save that was asked for and then not made)."""
        self._flush_state()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """One optimizer step is done: report it, and ask for the checkpoint the harness wants."""
        step = int(state.global_step)
        self.run.step_end(step)
        if self.run.should_checkpoint(step):
            control.should_save = True
        if control.should_save:
            self._state_due = step  # reported in on_save, after the checkpoint is published
        else:
            self._report_state(step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """Publish the checkpoint the Trainer just finished writing."""
        step = int(state.global_step)
        folder = _output_dir(args) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if not is_complete(folder):
            raise RuntimeError(ERR_SAVE_INCOMPLETE.format(step=step, folder=folder, file=TRAINER_STATE_FILE))
        if self.durable:
            sync_tree(folder)
        self.run.checkpoint_published(step, folder)
        self._flush_state()

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._flush_state()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Report the trained model as the final output, and stop watching the model (it is left as it
        was before ``train()``)."""
        self._flush_state()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        model = kwargs.get("model")
        if self.report_final and model is not None:
            self.run.final({STATE_MODEL: model})

    def restored_state(self) -> dict[str, Any]:
        """The state reported at the restored step, in ``on_train_begin``: what the Trainer restored by
        then (model, optimizer, LR scheduler, trainer state). Not the RNGs: the Trainer restores them only
        in the first epoch it runs, at its start after a resume at an epoch boundary, or, inside an epoch,
        after it collated the first batches (docs/findings.md); they are compared from the first step after
        the resume on. Nor ``extra_state``, which the user's code restores at a time of its own: it is reported
        for the restored step as the first resumed batch reaches the model, when that code has run (so an
        attribute of the user's own that the checkpoint does not hold is named at the restored step)."""
        return self._trainer_components()

    # -- internals ---------------------------------------------------------------------------------
    def _restored_folder(self, args: TrainingArguments, step: int) -> Path | None:
        """The folder the Trainer restored ``step`` from. The Trainer passes its callbacks no path, so it is the
        folder that holds that step: ``run.resume_path`` (path mode), else ``checkpoint-<step>`` in the output
        directory; None (the report names the step alone) when neither does."""
        if step == 0:
            return None
        own = _output_dir(args) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        for folder in (self.run.resume_path, own):
            if folder is not None and recorded_step(folder) == step:
                return folder
        return None

    def _take_ids(self, module: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Forward pre-hook: read (and with a key, remove) the ids; report them while the Trainer trains."""
        if isinstance(self.ids, str):
            if self.ids not in kwargs:
                if not module.training:  # an evaluation batch without ids: nothing to take out
                    return None
                raise KeyError(ERR_NO_ID_KEY.format(key=self.ids, keys=sorted(kwargs)))
            kwargs = dict(kwargs)
            ids = _id_list(kwargs.pop(self.ids))
            changed: tuple[tuple[Any, ...], dict[str, Any]] | None = (args, kwargs)
        else:
            try:
                ids = _id_list(self.ids(kwargs))
            except Exception as exc:  # the user's function: say which one failed
                raise ValueError(ERR_IDS_RAISED.format(error=f"{type(exc).__name__}: {exc}",
                                                       keys=sorted(kwargs))) from exc
            size = _batch_size(kwargs)
            if size is not None and len(ids) != size:
                raise ValueError(ERR_IDS_COUNT.format(count=len(ids), size=size, keys=sorted(kwargs)))
            changed = None
        if module.training and self._state is not None and self._epoch is not None:
            if self._extra_due is not None and self.extra_state is not None:
                # The restored step's extra_state, as the first resumed batch reaches the model: whatever the
                # user's code restores, it has restored by now, and nothing of the next step has changed it.
                restored, self._extra_due = self._extra_due, None
                self.run.state(restored, dict(self.extra_state()))
            self.run.consumed(ids, step=int(self._state.global_step) + 1, epoch=self._epoch)
            self._batches.append(dict(changed[1] if changed is not None else kwargs))
        return changed

    def _flush_state(self) -> None:
        if self._state_due is not None:
            step, self._state_due = self._state_due, None
            self._report_state(step)

    def _report_state(self, step: int) -> None:
        # The step's batches first: the cause, when a collator drew other masks, before what trained on them.
        components: dict[str, Any] = {STATE_BATCH: self._batches, **self._trainer_components()}
        self._batches = []
        components[STATE_RNG] = rng_state()
        if self.extra_state is not None:
            components.update(self.extra_state())
        self.run.state(step, components)

    def _trainer_components(self) -> dict[str, Any]:
        """Model, optimizer, LR scheduler (as the Trainer handed them to the callbacks) and trainer state."""
        components: dict[str, Any] = {name: value for name, value in self._objects.items() if value is not None}
        if self._state is not None:
            components[STATE_TRAINER] = {f: getattr(self._state, f) for f in TRAINER_STATE_FIELDS}
        return components


def _output_dir(args: TrainingArguments) -> Path:
    """``args.output_dir``, typed optional: ``TrainingArguments.__post_init__`` replaces a None with its
    default folder, so a Trainer's arguments always name one."""
    assert args.output_dir is not None
    return Path(args.output_dir)


def _updates_per_epoch(loader: Any, accumulation: int) -> int | None:
    """Optimizer steps per epoch, as ``Trainer.set_initial_training_values`` counts them (None: no length)."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    return max(batches // accumulation + int(batches % accumulation > 0), 1)


def _id_list(values: Any) -> list[Any]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        values = [values]
    return list(values)


def _batch_size(batch: Mapping[str, Any]) -> int | None:
    """The number of examples in a batch: the first dimension of its first tensor."""
    for value in batch.values():
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None
