"""A Hugging Face Accelerate trainer, written the way its users write one, checked through
:class:`pytest_resume_check.integrations.accelerate.AccelerateResumeCheck`.

:func:`fit` is the trainer: a small regression network with dropout, AdamW with a warm-up ``LambdaLR`` or a
``StepLR``, ``accelerator.accumulate`` for gradient accumulation, a progress counter registered with
``register_for_checkpointing``, checkpoints with ``save_state`` (automatic naming with ``total_limit``, or
explicit ``step_<N>`` folders; optionally one more at the end of each epoch) and a resume with ``load_state``
that skips the batches already trained on either through a stateful loader (``use_stateful_dataloader=True``)
or with ``accelerator.skip_first_batches``. The trainer chooses the folder to resume from itself
(:func:`checkpoint_to_resume`: the highest-numbered folder, or the run's ``resume_path``), so the matrix tests
that choice. :func:`train` is the target: it builds the ``Accelerator`` for the run and hands the loop to
``AccelerateResumeCheck``, which reports the folder ``load_state`` was given.

Shuffling is seeded the way Accelerate resumes it: ``use_seedable_sampler=True`` and ``loader.set_epoch(epoch)``
(the default sampler draws a new permutation from the global RNG when a resumed loop starts). The data loader
has its own ``torch.Generator``: without one it draws its base seed from the global RNG that ``load_state``
has just restored, and the dropout masks after a resume differ from the uninterrupted run's
(:func:`train_loader_without_generator`, docs/examples/findings/accelerate_loader_rng.py).

The planted-bug variants (:func:`train_loader_not_restored`, :func:`train_optimizer_not_prepared`,
:func:`train_name_sorted_resume`) and the findings' raw configurations (:func:`train_loader_without_generator`,
:func:`train_raw_naming`) are module-level target functions outside :data:`TARGETS`;
tests/engine/test_integration_accelerate.py runs them.

torch and accelerate are imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from pytest_resume_check.builtin.epochs import AccumulatedEpochs
from pytest_resume_check.ids import WithIds
from pytest_resume_check.integrations.durable import leaves_incomplete
from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH, RunContext
from pytest_resume_check.targets import resume_target

FEATURES = 4
STATEFUL, SKIP = "stateful", "skip"  # how a resumed run skips the batches already trained on
AUTO, FOLDERS = "auto", "folders"  # automatic checkpoint naming, or explicit folders

#: Planted bugs (and the raw configurations of the findings).
LOADER_NOT_RESTORED = "loader_not_restored"  # prepared after load_state / no skip_first_batches -> DUPLICATED
OPTIMIZER_NOT_PREPARED = "optimizer_not_prepared"  # save_state never sees the optimizer -> STATE_DIVERGED
LOADER_WITHOUT_GENERATOR = "loader_without_generator"  # finding: resumed loader draws from the global RNG
RAW_NAMING = "raw_naming"  # finding: Accelerate's checkpoint numbering after load_state, not continued
NAME_SORTED = "name_sorted"  # the newest folder by name: step_9 after step_10, checkpoint_9 after _10 -> STALE_RESUME

#: The trainer's checkpoint folders: Accelerate's ``checkpoints/checkpoint_<n>`` (n counts saves from 0) under
#: automatic naming, else ``step_<N>`` (N: the optimizer step) directly in the output directory.
AUTO_CHECKPOINTS, AUTO_NAME, STEP_NAME = "checkpoints", re.compile(r"checkpoint_(\d+)"), re.compile(r"step_(\d+)")

DEFAULT_CASE: dict[str, Any] = {"n": 10, "batch": 2, "epochs": 2, "ga": 1, "shuffle": False, "workers": 0,
                                "loader": STATEFUL, "naming": AUTO, "limit": None, "every": None,
                                "epoch_checkpoints": False, "scheduler": "lambda"}


#: The case's step counts (pytest_resume_check.builtin.epochs).
_EPOCHS = AccumulatedEpochs(DEFAULT_CASE, "ga")
params, steps_per_epoch = _EPOCHS.params, _EPOCHS.steps_per_epoch
total_steps, epoch_boundaries = _EPOCHS.total_steps, _EPOCHS.epoch_boundaries


# -- the trainer (what a user has) ---------------------------------------------------------------

@dataclass
class Config:
    """The trainer's settings."""

    output_dir: str
    seed: int = 0
    n: int = 10
    batch_size: int = 2
    epochs: int = 2
    shuffle: bool = False
    num_workers: int = 0
    skip_batches: bool = False  # resume by accelerator.skip_first_batches (else the loader is stateful)
    checkpoint_every: int | None = None  # optimizer steps between checkpoints
    epoch_checkpoints: bool = False  # also save at the end of each epoch
    scheduler: str = "lambda"
    loader_generator: bool = True


class Features:
    """Map-style dataset of fixed random rows and regression targets."""

    def __init__(self, n: int):
        import torch

        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = self.x @ torch.randn(FEATURES, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}


class Progress:
    """The trainer's counters, saved and loaded by ``save_state`` / ``load_state``."""

    def __init__(self) -> None:
        self.step = 0  # optimizer steps
        self.epoch = 0
        self.batches = 0  # batches trained on in this epoch

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.step, self.epoch, self.batches = state["step"], state["epoch"], state["batches"]


def newest_checkpoint(folder: str, auto_naming: bool) -> str | None:
    """The trainer's own "which checkpoint" in auto mode: the checkpoint folder with the highest number, the
    one ``accelerator.load_state()`` would pick under automatic naming (None: none yet, a fresh start)."""
    root, pattern = (os.path.join(folder, AUTO_CHECKPOINTS), AUTO_NAME) if auto_naming else (folder, STEP_NAME)
    found = [(int(m.group(1)), n) for n in _listdir(root) if (m := pattern.fullmatch(n))]
    return os.path.join(root, max(found)[1]) if found else None


def newest_by_name(folder: str, auto_naming: bool) -> str | None:
    """Planted bug: the newest checkpoint taken as the last folder name in sorted order. Right while the
    numbers have one digit; then ``step_10`` sorts before ``step_9`` and ``checkpoint_10`` before ``checkpoint_9``."""
    root, pattern = (os.path.join(folder, AUTO_CHECKPOINTS), AUTO_NAME) if auto_naming else (folder, STEP_NAME)
    names = sorted(n for n in _listdir(root) if pattern.fullmatch(n))
    return os.path.join(root, names[-1]) if names else None


def checkpoint_to_resume(run: RunContext, auto_naming: bool,
                         newest: Callable[[str, bool], str | None] = newest_checkpoint) -> str | None:
    """The folder the trainer loads under the run's resume mode: ``newest`` in its output directory (``auto``),
    the folder it was given (``path``), or none (``disabled``)."""
    if run.resume_mode == RESUME_PATH:
        return str(run.resume_path)
    return newest(str(run.checkpoint_dir), auto_naming) if run.resume_mode == RESUME_AUTO else None


def _listdir(folder: str) -> list[str]:
    return os.listdir(folder) if os.path.isdir(folder) else []


def fit(accelerator: Any, config: Config, resume_from: str | os.PathLike[str] | None = None,
        bug: str | None = None) -> None:
    """Train; resume from the ``save_state`` folder ``resume_from`` if given.

    One function on purpose: it reads as the loop an Accelerate user writes, and each planted bug is one
    ``if bug == ...`` beside the line it replaces.
    """
    import torch
    from accelerate.utils import set_seed

    set_seed(config.seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    if config.scheduler == "step":
        scheduler: Any = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    generator = torch.Generator().manual_seed(config.seed) if config.loader_generator else None
    # A map-style dataset by duck typing, as DataLoader takes one; typed as torch's Dataset, which it does not
    # subclass so that importing this module does not import torch.
    dataset = cast("torch.utils.data.Dataset[dict[str, Any]]", WithIds(Features(config.n)))
    # Any: accelerator.prepare replaces it with Accelerate's own loader (untyped; it has set_epoch).
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, shuffle=config.shuffle,
                                              num_workers=config.num_workers, generator=generator)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if bug == OPTIMIZER_NOT_PREPARED:
        model, scheduler = accelerator.prepare(model, scheduler)
    else:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if bug != LOADER_NOT_RESTORED:
        loader = accelerator.prepare(loader)
    if resume_from is not None:
        accelerator.load_state(resume_from)
    if bug == LOADER_NOT_RESTORED:
        loader = accelerator.prepare(loader)  # too late: load_state restored no loader position
    if progress.batches == len(loader):  # saved after the epoch's last batch, before the epoch was closed
        progress.epoch, progress.batches = progress.epoch + 1, 0
    start_epoch, skip = progress.epoch, progress.batches

    for epoch in range(start_epoch, config.epochs):
        loader.set_epoch(epoch)
        batches = loader
        if config.skip_batches and epoch == start_epoch and skip and bug != LOADER_NOT_RESTORED:
            batches = accelerator.skip_first_batches(loader, skip)
        for batch in batches:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.batches += 1
            if accelerator.sync_gradients:
                progress.step += 1
                if config.checkpoint_every and progress.step % config.checkpoint_every == 0:
                    _save(accelerator, config, progress.step)
        progress.epoch, progress.batches = epoch + 1, 0
        if config.epoch_checkpoints:
            _save(accelerator, config, progress.step)


def _save(accelerator: Any, config: Config, step: int) -> None:
    if accelerator.project_configuration.automatic_checkpoint_naming:
        accelerator.save_state()  # project_dir/checkpoints/checkpoint_<n>
    else:  # one folder a step: an epoch-end save replaces an in-loop save of the same step, which it follows
        accelerator.save_state(os.path.join(config.output_dir, f"step_{step}"))


# -- the target (the glue) -------------------------------------------------------------------------

def train(run: RunContext, bug: str | None = None) -> None:
    """Accelerate trainer (save_state/load_state) watched by AccelerateResumeCheck: the correct variant."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

    from pytest_resume_check.integrations.accelerate import AccelerateResumeCheck

    p = params(run.case)
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=p["ga"],
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=p["loader"] == STATEFUL,
                                                  use_seedable_sampler=True),
        project_config=ProjectConfiguration(project_dir=str(run.checkpoint_dir),
                                            automatic_checkpoint_naming=p["naming"] == AUTO, total_limit=p["limit"]))
    config = Config(output_dir=str(run.checkpoint_dir), seed=run.seed, n=p["n"], batch_size=p["batch"],
                    epochs=p["epochs"], shuffle=p["shuffle"], num_workers=p["workers"],
                    skip_batches=p["loader"] == SKIP, checkpoint_every=p["every"],
                    epoch_checkpoints=p["epoch_checkpoints"],
                    scheduler=p["scheduler"], loader_generator=bug != LOADER_WITHOUT_GENERATOR)
    resume = checkpoint_to_resume(run, p["naming"] == AUTO, newest_by_name if bug == NAME_SORTED else newest_checkpoint)
    with AccelerateResumeCheck(run, accelerator, ids="input_id", continue_naming=bug != RAW_NAMING):
        fit(accelerator, config, resume_from=resume, bug=bug)  # the check reports the folder load_state loads


def train_loader_not_restored(run: RunContext) -> None:
    """Planted bug: the loader is prepared after ``load_state`` (or, skipping by count, never skipped)."""
    train(run, LOADER_NOT_RESTORED)


def train_optimizer_not_prepared(run: RunContext) -> None:
    """Planted bug: the optimizer is not passed to ``prepare``, so ``save_state`` never saves it."""
    train(run, OPTIMIZER_NOT_PREPARED)


def train_name_sorted_resume(run: RunContext) -> None:
    """Planted bug: the trainer resumes from the last folder name in sorted order (step_9 after step_10)."""
    train(run, NAME_SORTED)


def train_loader_without_generator(run: RunContext) -> None:
    """Finding: a DataLoader without its own generator draws from the RNG ``load_state`` restored."""
    train(run, LOADER_WITHOUT_GENERATOR)


def train_raw_naming(run: RunContext) -> None:
    """Finding: Accelerate's automatic checkpoint numbering, not continued after ``load_state``."""
    train(run, RAW_NAMING)


PRELOAD = ("torch", "torchdata.stateful_dataloader", "accelerate", "pytest_resume_check.builtin.accelerate_example",
           "pytest_resume_check.integrations.accelerate:warm_up")

#: Cases: a stateful loader with gradient accumulation (an epoch's last step takes one batch), keep-last-2
#: automatic naming, the trainer's own checkpoints every 3 steps (at each epoch's last batch) and at each
#: epoch's end; a shuffled stateful loader with 2 workers (12 inputs: 4 are left after its last kill inside
#: epoch 0, so none of its expected failures continues the right order by chance, 1 in 11880);
#: skip_first_batches over a shuffled loader with accumulation, explicit folders, epoch-end checkpoints and
#: a StepLR.
CASES = (
    {"id": "stateful-ga2-keep2", "loader": STATEFUL, "ga": 2, "limit": 2, "every": 3, "epoch_checkpoints": True},
    {"id": "stateful-shuffle-w2", "loader": STATEFUL, "n": 12, "batch": 4, "shuffle": True, "workers": 2},
    {"id": "skip-shuffle-ga2-folders", "loader": SKIP, "n": 8, "ga": 2, "shuffle": True, "naming": FOLDERS,
     "epoch_checkpoints": True, "scheduler": "step"},
)


def declare(fn: Any, name: str, cases: Any = CASES, **options: Any) -> Any:
    """A target over :func:`fit` with this module's steps, boundaries and preload."""
    return resume_target(fn, name=name, steps=total_steps, boundaries=epoch_boundaries, cases=cases,
                         contract="exactly_once_ordered", preload=PRELOAD, **options)



def resumes_in_first_epoch_with_workers(cell: Any) -> bool:
    """A cell of the shuffled stateful case with loader workers that resumes from a checkpoint of epoch 0
    (its end included): those replay or skip inputs (docs/findings.md, accelerate and workers)."""
    p = params(cell.case)
    in_epoch_0 = any(0 < kill.checkpoint_step <= steps_per_epoch(cell.case) for kill in cell.kills)
    return p["workers"] > 0 and p["shuffle"] and p["loader"] == STATEFUL and in_epoch_0


#: The known upstream bug the shuffled stateful case with workers runs into.
WORKERS_BUG = ("accelerate 1.15 + torchdata 0.11, use_stateful_dataloader + use_seedable_sampler + num_workers>0: "
               "prepare() starts the loader's iterator before the seedable sampler replaces the plain one, so "
               "epoch 0 is shuffled by one sampler and a resume fast-forwards the other; a resume at the end of "
               "epoch 0 continues with epoch 2's order (huggingface/accelerate#4204; docs/findings.md)")

#: The file AccelerateResumeCheck writes last in a save (its marker, through this temporary name, then fsynced): the
#: integration's ``MARKER``, named here without importing accelerate.
MARKER_TMP = "resume_check.json.tmp"


def unfinished_folder_taken(cell: Any) -> bool:
    """A crash cell (the default smoke cells of the save of step 2) whose power loss comes before the save's
    last file is durable: the folder is left unfinished, and ``load_state()`` takes it all the same."""
    return leaves_incomplete(cell, MARKER_TMP)


#: Accelerate 1.16's ``load_state()`` without a folder takes the highest-numbered ``checkpoint_<n>``, whether
#: its save finished or not (``save_state`` writes no file that says so).
UNFINISHED_TAKEN = ("accelerate: load_state() takes the highest-numbered checkpoint_<n>, finished or not; a power "
                    "loss before the save's last file is durable leaves one it takes (a crash smoke cell; "
                    "docs/recipes/accelerate.md#crash-smoke-cells)")

#: The Accelerate loop (save_state/load_state) watched by AccelerateResumeCheck.
accelerate_example = declare(train, "accelerate_example",
                             expected_failures=[(resumes_in_first_epoch_with_workers, WORKERS_BUG),
                                                (unfinished_folder_taken, UNFINISHED_TAKEN)])


def _has_accelerate() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("torch", "torchdata", "accelerate"))


#: Offered through the ``pytest_resume_check.targets`` entry point where accelerate is installed.
TARGETS = [accelerate_example] if _has_accelerate() else []
