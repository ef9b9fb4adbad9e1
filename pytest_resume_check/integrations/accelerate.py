"""Glue between a Hugging Face Accelerate training loop and the run context.

An Accelerate trainer is the user's own loop: ``accelerator.prepare(...)``, ``with accelerator.accumulate(model):``,
``accelerator.save_state(...)`` and ``accelerator.load_state(...)``. :class:`AccelerateResumeCheck` watches that loop
through the one ``Accelerator`` it is given, so the loop itself stays as it is::

    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=run.checkpoint_dir, automatic_checkpoint_naming=True, total_limit=2))
    resume = {"auto": "latest", "path": run.resume_path}.get(run.resume_mode)  # the trainer's own option
    with AccelerateResumeCheck(run, accelerator, ids="input_id"):      # before accelerator.prepare(...)
        my_trainer.train(accelerator, resume_from=resume)    # its own code chooses and calls load_state(...)

``AccelerateResumeCheck`` never chooses the checkpoint: the trainer's code does, as it does outside the harness, and
``load_state`` reports the folder it was given (the matrix judges it: an older one than the newest published
is ``STALE_RESUME``). For a trainer with no resume logic of its own, :attr:`AccelerateResumeCheck.resume_from` is a
helper that chooses.

It wraps four methods *of that instance* (the class is untouched, and leaving the ``with`` block puts
them back):

- ``prepare``: every data loader it returns is handed back wrapped, so each batch taken from it is
  reported (``run.consumed``, ids read with ``ids``) in the step it trains in. The other objects are
  returned as they are. ``skip_first_batches`` is wrapped the same way.
- The step count is *optimizer* steps: a step ends when the loop asks for the next batch (or the loader
  is exhausted, or ``save_state`` is called) after a batch whose ``accumulate`` block synchronised the
  gradients (``accelerator.sync_gradients``). Then ``run.step_end(step)`` and the state is reported
  (:data:`STATE_COMPONENTS`).
- A checkpoint the harness asks for (``run.should_checkpoint``) is the trainer's own ``save_state`` call
  when one comes before the next batch is taken (an in-loop schedule, or an epoch-end checkpoint after the
  loader is exhausted); otherwise ``AccelerateResumeCheck`` calls ``save_state`` itself at that point.
- ``save_state``: after Accelerate returns, every file of the folder is flushed to disk and a small
  :data:`MARKER` file (step, epoch, position) is written into it by an atomic rename; only then is the
  checkpoint *published* (``run.checkpoint_published``). A folder without the marker (a save killed
  half-way) is never resumed from.
- ``load_state``: loads the folder given, or with no folder (automatic naming) the one Accelerate picks
  itself, the highest-numbered ``checkpoint_<n>`` (:func:`accelerate_pick`), whether or not it is the
  newest or complete. Then reports ``run.resumed(step, folder)`` with the step the folder's marker records
  (a folder without one, which AccelerateResumeCheck never published, is refused with an error naming it: its step is
  unknown) and, right after Accelerate returns, the state it restored (``run.state`` at that step, see
  :meth:`AccelerateResumeCheck.restored_state`). With
  automatic checkpoint naming it also sets ``accelerator.project_configuration.iteration`` past the
  highest ``checkpoint_<n>`` folder: Accelerate 1.15 leaves it at 0 after a load, so the next
  ``save_state`` fails with "checkpoint_0 (0) already exists", or, with ``total_limit``, deletes an older
  checkpoint and writes the new one as ``checkpoint_0``, which the next ``load_state()`` passes over for
  an older, higher-numbered one (huggingface/accelerate#1601 and
  huggingface/accelerate#3306; docs/examples/findings/accelerate_checkpoint_naming.py).
- Leaving the ``with`` block normally (the end of training) reports the prepared models, unwrapped, as
  what the job delivers (``run.final``); ``report_final=False`` turns that off.

Epochs are counted by the loaders: the epoch advances after a loader's last batch of a pass (an empty
pass, such as a resumed loader that was already at its end, does not count).

The trainer keeps everything else: restoring its own counters (``register_for_checkpointing``), skipping
consumed batches (a stateful loader restored by ``load_state``, or ``accelerator.skip_first_batches``),
``loader.set_epoch(epoch)`` for seeded shuffling. That is what the harness tests.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import numpy as np
import torch
from accelerate import Accelerator

from pytest_resume_check.ids import DEFAULT_ID_KEY, ids_of
from pytest_resume_check.integrations.durable import fsync_path, sync_tree
from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH, RunContext

__all__ = ["AccelerateResumeCheck", "MARKER", "accelerate_pick", "latest_published", "next_checkpoint_number",
           "read_marker", "warm_up", "write_marker"]

#: Written into a checkpoint folder once ``save_state`` has returned and the folder is on disk: its
#: presence is what makes the folder a published checkpoint. JSON with the keys below.
MARKER = "resume_check.json"
MARKER_FORMAT = 1
KEY_FORMAT, KEY_STEP, KEY_EPOCH, KEY_BATCHES, KEY_WRITTEN = "format", "step", "epoch", "batches", "written_ns"
#: Optional marker key: 1 when the folder was saved as its step ended, before the trainer's code ran on, so
#: it holds the state reported for that step (an epoch-end save of a step already ended holds what the
#: trainer did since); markers without it read as 0.
KEY_AT_STEP_END = "at_step_end"
#: Accelerate's folder under ``project_dir`` with automatic checkpoint naming, and its folder names.
AUTO_FOLDER = "checkpoints"
AUTO_NAME = re.compile(r"checkpoint_(\d+)")
#: The number Accelerate orders folders by when ``load_state()`` picks one: the first in the folder's name.
FIRST_NUMBER = re.compile(r"(\d+)")
#: Where checkpoints the harness asks for go without automatic naming (relative to ``run.checkpoint_dir``).
DEFAULT_FOLDER = "step_{step}"
#: The state reported after each step, by component (``run.state``): the models, optimizers and LR
#: schedulers ``prepare`` returned, the objects given to ``register_for_checkpointing``, the RNGs
#: ``save_state`` saves, and the data position (stateful loaders' state, epoch, batches of the epoch,
#: Accelerate's accumulation counter).
STATE_COMPONENTS = ("model", "optimizer", "scheduler", "registered", "rng", "data")
#: The component the final outputs report (the models), and the one left out at a restored step.
STATE_MODEL, STATE_DATA = "model", "data"
WRAPPED = ("prepare", "skip_first_batches", "save_state", "load_state")
#: The setting reported when ``prepare`` returns a data loader (``run.settings``): whether every loader prepared
#: so far has a generator of its own. One without draws its iterators' seed from the global torch RNG, which a
#: resume inside an epoch has just restored (docs/findings.md); the report's known findings read it.
SETTING_LOADER_GENERATOR = "loader_generator"

ERR_PREPARED = ("AccelerateResumeCheck: accelerator.prepare(...) already returned {count} data loader(s), which it "
                "cannot watch; create AccelerateResumeCheck(run, accelerator) before calling accelerator.prepare")
ERR_TWICE = ("AccelerateResumeCheck: this accelerator is already watched by another AccelerateResumeCheck; create "
             "one per accelerator")
ERR_PROJECT_DIR = ("AccelerateResumeCheck: automatic_checkpoint_naming saves under project_dir={project_dir}, outside "
                   "run.checkpoint_dir={checkpoint_dir}, so a resumed run would not find them; pass "
                   "ProjectConfiguration(project_dir=run.checkpoint_dir, automatic_checkpoint_naming=True)")
ERR_NOT_PUBLISHED = ("AccelerateResumeCheck: {folder} holds no {marker}, so it is not a checkpoint "
                     "AccelerateResumeCheck published (a save killed half-way, or one written without "
                     "AccelerateResumeCheck) and the step it holds is unknown; load a published folder "
                     "(accelerator.load_state() without a folder takes the highest-numbered checkpoint_<n>, finished "
                     "or not; check.resume_from is the newest published one)")
ERR_BAD_MARKER = ("AccelerateResumeCheck: {path} is not a checkpoint marker AccelerateResumeCheck can read "
                  "({problem}); delete the folder")
ERR_NO_RESUME_PATH = ("AccelerateResumeCheck: resume mode 'path' needs run.resume_path to be a published checkpoint "
                      "folder, got {path}")
ERR_NOTHING_TO_LOAD = ("AccelerateResumeCheck: accelerator.load_state() with no folder loads the highest-numbered "
                       "folder under {root}, but there is none; call it only once a checkpoint was saved (a first run "
                       "starts fresh)")
ERR_IDS = ("AccelerateResumeCheck: cannot read input ids from a {kind} batch with ids={ids!r} ({error}); pass "
           "ids='<key of the id tensor>' or ids=<function(batch) -> ids>")
ERR_IDS_TYPE = "AccelerateResumeCheck: ids must be a batch key (str) or a function(batch) -> ids, got {kind}"


class AccelerateResumeCheck:
    """Reports an Accelerate loop's consumption, steps, state and checkpoints to the run context.

    ``run``: the target's :class:`~pytest_resume_check.run.RunContext`. ``accelerator``: the loop's
    ``Accelerator``, not yet used by ``prepare``. ``ids``: the batch key holding the input ids (a tensor,
    array or list, e.g. from :class:`~pytest_resume_check.WithIds`) or a function ``batch -> ids``.
    ``folder``: where the checkpoints the harness asks for are saved when automatic checkpoint naming is
    off, relative to ``run.checkpoint_dir`` (``{step}`` is replaced). ``continue_naming``: set
    ``project_configuration.iteration`` past the existing ``checkpoint_<n>`` folders after a load (pass
    False if the trainer sets it itself). ``report_final``: report the prepared models (unwrapped) as what
    the job delivers when the ``with`` block is left normally (``run.final``), so a resumed job that ends
    with another model than an uninterrupted one fails; a target that reports final outputs is never
    stopped early, so its last run trains to the end.

    What is reported when: after a resume, right after ``load_state`` returns, the restored state
    (:meth:`restored_state`) at the restored step; after each optimizer step its state
    (:data:`STATE_COMPONENTS`); at the end the final models.

    Use it as a context manager around the training: leaving the block normally ends the last step and
    puts the accelerator's methods back.
    """

    def __init__(self, run: RunContext, accelerator: Accelerator, *,
                 ids: str | Callable[[Any], Iterable[Any]] = DEFAULT_ID_KEY, folder: str = DEFAULT_FOLDER,
                 continue_naming: bool = True, report_final: bool = True):
        if not (isinstance(ids, str) or callable(ids)):
            raise TypeError(ERR_IDS_TYPE.format(kind=type(ids).__name__))
        if any(name in vars(accelerator) for name in WRAPPED):
            raise RuntimeError(ERR_TWICE)
        prepared = _tracked(accelerator, "_dataloaders")
        if prepared:
            raise RuntimeError(ERR_PREPARED.format(count=len(prepared)))
        self._run = run
        self._accelerator = accelerator
        self._ids = ids
        self._folder = folder
        self._continue_naming = continue_naming
        self._report_final = report_final
        config = accelerator.project_configuration
        self._auto_naming = bool(config.automatic_checkpoint_naming)
        if self._auto_naming and not _inside(Path(config.project_dir or "."), run.checkpoint_dir):
            raise ValueError(ERR_PROJECT_DIR.format(project_dir=config.project_dir, checkpoint_dir=run.checkpoint_dir))
        self._step = 0  # optimizer steps completed
        self._epoch = 0  # the epoch of the next batch taken
        self._batches = 0  # batches taken in that epoch
        self._pending = False  # batches taken since the last step ended
        self._owed: int | None = None  # a step the harness wants a checkpoint of, not yet saved
        self._published: set[int] = set()
        self._resumed = False
        # The state of the last ended step is what the objects hold: true from the step's end until the
        # trainer's code runs on (a batch taken, a pass over the loader ended, a save_state of it returned).
        self._at_step_end = False
        self._loader_generators: list[bool] = []  # of each loader prepare returned: has it a generator?
        self._originals = {name: getattr(accelerator, name) for name in WRAPPED}
        accelerator.prepare = self._prepare
        accelerator.skip_first_batches = self._skip_first_batches
        accelerator.save_state = self._save_state
        accelerator.load_state = self._load_state

    # -- what the glue reads -------------------------------------------------------------------
    @property
    def resume_from(self) -> Path | None:
        """A helper for a trainer with no resume logic of its own: the checkpoint folder to ``load_state``
        from under ``run.resume_mode``, in ``auto`` the newest published one in this run's checkpoint folders
        by step (None when there is none yet), in ``path`` exactly ``run.resume_path``, in ``disabled`` None.
        A trainer that chooses its checkpoint itself should keep doing so under the matrix, which then tests
        that choice."""
        if self._run.resume_mode == RESUME_PATH:
            path = self._run.resume_path
            if path is None or not (path / MARKER).is_file():
                raise FileNotFoundError(ERR_NO_RESUME_PATH.format(path=path))
            return path
        if self._run.resume_mode == RESUME_AUTO:
            return self._latest()
        return None

    @property
    def step(self) -> int:
        """Optimizer steps completed so far (restored by ``load_state``)."""
        return self._step

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> AccelerateResumeCheck:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            for name in WRAPPED:
                vars(self._accelerator).pop(name, None)

    def finish(self) -> None:
        """End the last step (if its gradients were synchronised), report a fresh start if the loop
        never took a batch, and report the final models (``report_final``). Leaving the ``with`` block
        normally calls it."""
        self._report_fresh_start()
        self._end_step()
        if self._report_final:
            acc = self._accelerator
            self._run.final({STATE_MODEL: [acc.unwrap_model(model) for model in _tracked(acc, "_models")]})

    def restored_state(self) -> dict[str, Any]:
        """The state reported at the restored step, right after ``load_state``: every component of
        :data:`STATE_COMPONENTS` except ``data`` when a stateful loader is prepared. Accelerate's prepared
        loader answers ``state_dict()`` with a copy it takes each time it yields a batch, and its
        ``load_state_dict`` passes the state to the loader inside without updating that copy: until the
        first resumed batch it reads the position it had before the load (the start, in a new process),
        not the restored one (accelerate 1.16 ``DataLoaderAdapter``; huggingface/accelerate#4244, open).
        The position is compared from the first step after the resume on, where the batches taken show it.
        (A ``save_state`` in that window writes that stale position: resumed from it, the loader starts the
        epoch over.)"""
        state = self._state()
        if any(getattr(dl, "use_stateful_dataloader", False) for dl in _tracked(self._accelerator, "_dataloaders")):
            del state[STATE_DATA]
        return state

    # -- wrapped methods -----------------------------------------------------------------------
    def _prepare(self, *args: Any, **kwargs: Any) -> Any:
        result = self._originals["prepare"](*args, **kwargs)
        loaders = [obj for obj in (result if isinstance(result, tuple) else (result,))
                   if isinstance(obj, torch.utils.data.DataLoader)]
        if loaders:
            self._loader_generators += [getattr(loader, "generator", None) is not None for loader in loaders]
            self._run.settings({SETTING_LOADER_GENERATOR: all(self._loader_generators)})
        if isinstance(result, tuple):
            return tuple(self._watch(obj) for obj in result)
        return self._watch(result)

    def _skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        inner = dataloader.loader if isinstance(dataloader, WatchedLoader) else dataloader
        return self._watch(self._originals["skip_first_batches"](inner, num_batches=num_batches))

    def _save_state(self, output_dir: str | os.PathLike[str] | None = None, *args: Any, **kwargs: Any) -> Any:
        self._end_step(saving=True)
        if output_dir is not None and not self._auto_naming:
            _unpublish(Path(output_dir))  # saving over a published folder: it stops being one first
        location = self._originals["save_state"](output_dir, *args, **kwargs)
        folder = Path(location if location is not None else output_dir)  # type: ignore[arg-type]
        self._publish(folder)
        self._at_step_end = False  # the trainer's code runs on (our own save: _end_step reports right after)
        return location

    def _load_state(self, input_dir: str | os.PathLike[str] | None = None, *args: Any, **kwargs: Any) -> Any:
        if input_dir is None:
            if not self._auto_naming:  # Accelerate's own error: no folder and nothing to pick from
                return self._originals["load_state"](input_dir, *args, **kwargs)
            picked = accelerate_pick(self._auto_root())  # what Accelerate loads: loaded by name, so reported right
            if picked is None:
                raise FileNotFoundError(ERR_NOTHING_TO_LOAD.format(root=self._auto_root()))
            folder = picked
        else:
            folder = Path(input_dir)
        marker = read_marker(folder)
        result = self._originals["load_state"](str(folder), *args, **kwargs)
        self._step, self._epoch, self._batches = marker[KEY_STEP], marker[KEY_EPOCH], marker[KEY_BATCHES]
        self._pending = False
        self._at_step_end = False
        if self._auto_naming and self._continue_naming:
            self._accelerator.project_configuration.iteration = next_checkpoint_number(self._auto_root())
        self._resumed = True
        self._run.resumed(self._step, folder)
        if self._step and marker[KEY_AT_STEP_END]:
            # A folder saved later (the trainer's epoch-end save of a step that had ended) holds what the
            # trainer did since, an epoch-end scheduler step say: not the state of the step. Its first
            # step after the resume is compared all the same.
            self._run.state(self._step, self.restored_state())
        return result

    # -- the loop ------------------------------------------------------------------------------
    def _watch(self, obj: Any) -> Any:
        if isinstance(obj, torch.utils.data.DataLoader) and not isinstance(obj, WatchedLoader):
            return WatchedLoader(self, obj)
        return obj

    def _iterate(self, loader: Any) -> Iterator[Any]:
        """One pass over ``loader``: end the previous step before each batch is taken, report the batch."""
        batches = iter(loader)
        taken = advanced = False
        while True:
            self._end_step()
            try:
                batch = next(batches)
            except StopIteration:
                break
            taken = True
            advanced = self._take(batch, last=bool(getattr(loader, "end_of_dataloader", False)))
            yield batch
        self._end_step(pass_end=True)  # a checkpoint wanted now may be the trainer's epoch-end one
        self._at_step_end = False  # the trainer's code after its pass runs next
        if taken and not advanced:  # a loader that does not say which batch is its last
            self._epoch, self._batches = self._epoch + 1, 0

    def _take(self, batch: Any, *, last: bool) -> bool:
        self._report_fresh_start()
        self._run.consumed(self._ids_of(batch), step=self._step + 1, epoch=self._epoch)
        self._pending = True
        self._at_step_end = False
        self._batches += 1
        if last:
            self._epoch, self._batches = self._epoch + 1, 0
        return last

    def _end_step(self, *, saving: bool = False, pass_end: bool = False) -> None:
        """Close the step whose batches were taken, once their accumulate block synchronised gradients,
        and save the checkpoint the harness wants of it: the ``save_state`` under way (``saving``), the
        trainer's own one after the loader is exhausted (``pass_end``: deferred to the next batch taken),
        or one of our own."""
        closed = None
        if self._pending and self._accelerator.sync_gradients:
            self._pending = False
            self._step += 1
            closed = self._step
            self._at_step_end = True
            self._run.step_end(closed)
            if self._run.should_checkpoint(closed):
                self._owed = closed
        if saving:
            self._owed = None  # the save under way is that checkpoint
        elif self._owed is not None and not pass_end:
            self._owed = None
            self._accelerator.save_state(self._harness_folder(self._step))
        if closed is not None:
            self._run.state(closed, self._state())

    def _report_fresh_start(self) -> None:
        if not self._resumed:
            self._resumed = True
            self._run.resumed(0)

    def _ids_of(self, batch: Any) -> list[Any]:
        try:
            if isinstance(self._ids, str):
                return ids_of(batch, self._ids)
            return list(self._ids(batch))
        except Exception as exc:
            raise TypeError(ERR_IDS.format(kind=type(batch).__name__, ids=self._ids,
                                           error=f"{type(exc).__name__}: {exc}")) from exc

    def _state(self) -> dict[str, Any]:
        acc = self._accelerator
        stateful = [dl.state_dict() for dl in _tracked(acc, "_dataloaders") if getattr(dl, "use_stateful_dataloader",
                                                                                         False)]
        return {
            "model": _tracked(acc, "_models"),
            "optimizer": _tracked(acc, "_optimizers"),
            "scheduler": _tracked(acc, "_schedulers"),
            "registered": _tracked(acc, "_custom_objects"),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(legacy=False)["state"]["key"],
                    "python": repr(random.getstate())},
            "data": {"loaders": stateful, "epoch": self._epoch, "batches": self._batches,
                     "accumulation": int(acc.step)},
        }

    # -- checkpoints ---------------------------------------------------------------------------
    def _harness_folder(self, step: int) -> str | None:
        if self._auto_naming:
            return None
        return str(self._run.checkpoint_dir / self._folder.format(step=step))

    def _publish(self, folder: Path) -> None:
        sync_tree(folder, skip=MARKER)
        write_marker(folder, {KEY_FORMAT: MARKER_FORMAT, KEY_STEP: self._step, KEY_EPOCH: self._epoch,
                              KEY_BATCHES: self._batches, KEY_WRITTEN: time.time_ns(),
                              KEY_AT_STEP_END: int(self._at_step_end)})
        if self._step not in self._published:  # a second save of one step (in-loop, then epoch-end) is
            self._published.add(self._step)  # published on disk, but the harness counts a step once
            self._run.checkpoint_published(self._step, folder)

    def _auto_root(self) -> Path:
        return Path(self._accelerator.project_configuration.project_dir or ".") / AUTO_FOLDER

    def _roots(self) -> list[Path]:
        roots = [self._auto_root()] if self._auto_naming else []
        return [*roots, self._run.checkpoint_dir]

    def _latest(self) -> Path | None:
        return latest_published(self._roots())


class WatchedLoader:
    """A prepared data loader whose batches are reported; everything else is the loader's own
    (``len``, ``set_epoch``, ``state_dict``, ...). ``loader`` is the Accelerate loader inside."""

    def __init__(self, check: AccelerateResumeCheck, loader: Any):
        self.loader = loader
        self._check = check

    def __iter__(self) -> Iterator[Any]:
        return self._check._iterate(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not yet set (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.loader, name)


def warm_up() -> None:
    """A preload warm-up for the fork server (``preload=(..., "pytest_resume_check.integrations.accelerate:warm_up")``):
    a few steps of a tiny Accelerate loop with a stateful, shuffled loader, gradient accumulation,
    ``save_state`` and ``load_state``, so each run starts with torch, torchdata and the checkpoint files
    initialised (about 1 s less per run here). Accelerate's process-wide state (``AcceleratorState``,
    ``GradientState``) is dropped afterwards, so no run inherits this accelerator's settings."""
    import tempfile

    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

    try:
        with tempfile.TemporaryDirectory() as tmp:
            for resume in (False, True):
                accelerator = Accelerator(
                    cpu=True, gradient_accumulation_steps=2,
                    dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True),
                    project_config=ProjectConfiguration(project_dir=tmp, automatic_checkpoint_naming=True))
                model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
                optimizer = torch.optim.AdamW(model.parameters())
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
                rows = [{"x": torch.ones(2), DEFAULT_ID_KEY: i} for i in range(4)]
                # A list is a map-style dataset to DataLoader, though not a torch Dataset to the type checker.
                data = cast("torch.utils.data.Dataset[dict[str, Any]]", rows)
                loader = torch.utils.data.DataLoader(data, batch_size=1, shuffle=True,
                                                     generator=torch.Generator().manual_seed(0))
                model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
                if resume:
                    accelerator.load_state()
                for batch in loader:
                    with accelerator.accumulate(model):
                        accelerator.backward(model(batch["x"]).sum())
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad()
                    if not resume:
                        accelerator.save_state()
                        break
                AcceleratorState._reset_state(reset_partial_state=True)
                GradientState._reset_state()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def read_marker(folder: Path) -> dict[str, int]:
    """The marker of a published checkpoint folder; raises with the fix when it is missing or unreadable."""
    path = Path(folder) / MARKER
    if not path.is_file():
        raise FileNotFoundError(ERR_NOT_PUBLISHED.format(folder=folder, marker=MARKER))
    try:
        data = json.loads(path.read_text())
        if data.get(KEY_FORMAT) != MARKER_FORMAT:
            raise ValueError(f"format {data.get(KEY_FORMAT)!r}, this version reads {MARKER_FORMAT}")
        marker = {key: int(data[key]) for key in (KEY_STEP, KEY_EPOCH, KEY_BATCHES, KEY_WRITTEN)}
        marker[KEY_AT_STEP_END] = int(data.get(KEY_AT_STEP_END, 0))
        return marker
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(ERR_BAD_MARKER.format(path=path, problem=exc)) from exc


def write_marker(folder: Path, content: Mapping[str, int]) -> None:
    """Write the marker through a temporary file, fsync, rename and fsync the folder."""
    tmp = folder / (MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(dict(content), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)
    fsync_path(folder)


def latest_published(roots: Iterable[Path]) -> Path | None:
    """The published checkpoint folder with the highest step (then the latest written) directly under
    any of ``roots``, or None."""
    best: tuple[int, int] | None = None
    found = None
    for root in roots:
        if not root.is_dir():
            continue
        for marker in root.glob(f"*/{MARKER}"):
            try:
                data = read_marker(marker.parent)
            except (OSError, ValueError):
                continue
            key = (data[KEY_STEP], data[KEY_WRITTEN])
            if best is None or key > best:
                best, found = key, marker.parent
    return found


def accelerate_pick(auto_root: Path) -> Path | None:
    """The folder ``accelerator.load_state()`` loads when given none, under automatic checkpoint naming: of the
    folders in ``project_dir/checkpoints``, the one whose name's first number is highest (accelerate 1.16
    ``Accelerator.load_state``; Accelerate fails on a name without a number, which is passed over here).
    Whether its save completed is not looked at. None when there is no such folder."""
    if not auto_root.is_dir():
        return None
    numbered = [(int(m.group(1)), name) for name in os.listdir(auto_root) if (m := FIRST_NUMBER.search(name))]
    if not numbered:
        return None
    numbered.sort(key=lambda found: found[0])  # stable, as Accelerate's sort: a tie goes to the last listed
    return auto_root / numbered[-1][1]


def next_checkpoint_number(auto_root: Path) -> int:
    """One past the highest ``checkpoint_<n>`` folder under ``auto_root`` (0 when there is none)."""
    numbers = [int(m.group(1)) for p in auto_root.glob("checkpoint_*") if (m := AUTO_NAME.fullmatch(p.name))]
    return max(numbers, default=-1) + 1


def _unpublish(folder: Path) -> None:
    marker = folder / MARKER
    if marker.exists():
        marker.unlink()
        fsync_path(folder)


def _tracked(accelerator: Any, name: str) -> list[Any]:
    """What ``prepare`` / ``register_for_checkpointing`` recorded on the accelerator (what ``save_state`` saves)."""
    return list(getattr(accelerator, name, None) or [])


def _inside(path: Path, root: Path) -> bool:
    path, root = path.resolve(), root.resolve()
    return path == root or root in path.parents
