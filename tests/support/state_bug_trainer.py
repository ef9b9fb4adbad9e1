"""A small real torch trainer with planted *state* bugs, for the harness's own tests.

An MLP with dropout (so the global torch RNG decides the run), Adam, a ``LambdaLR`` schedule and
gradient accumulation: each harness step is one micro-batch of ``take`` fixed feature rows (ids are
row indices, in order, for ``epochs`` epochs) and the optimizer steps every ``accum`` micro-batches.
A checkpoint (``step_N/state.pt``, written through tmp + fsync + rename, the newest ``KEEP`` folders
kept) holds everything that decides the rest of the run: model, optimizer, scheduler, global RNG,
the gradients of a half-finished accumulation window, the data position and the step. After every
step the trainer reports that state by component (``run.state``); a run that reaches the last step
writes its final weights to ``final.pt`` in its checkpoint directory (the tests' oracle).

The scheduler is a ``LambdaLR`` on purpose: its learning rate is a function of its own step count.
A chainable scheduler (``StepLR``, ``ExponentialLR``) multiplies the optimizer's restored rate, so a
forgotten scheduler state could leave every later rate right (or wrong only by a phase): the weights
would not show the bug that the state shows.

The ``bug`` argument plants one bug, each a one-line deviation beside the correct line. Case keys:
``n`` rows, ``take`` rows per step, ``epochs``, ``accum`` micro-batches per optimizer step.
torch is imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext

STATE_FILE = "state.pt"
FINAL_FILE = "final.pt"
#: Checkpoint folders kept: saving a new one deletes all but the newest KEEP.
KEEP = 2
FEATURES = 4
HIDDEN = 16
LR = 0.05
DEFAULT_CASE = {"n": 8, "take": 2, "epochs": 2, "accum": 2}

#: Planted bugs.
NEVER_RESUMES = "never_resumes"  # auto resume looks for a file no save writes: always from scratch -> STALE_RESUME
OLDER_CHECKPOINT = "older_checkpoint"  # auto resume takes the older of the kept folders -> STALE_RESUME
NO_SCHEDULER = "no_scheduler"  # scheduler state not saved: the schedule restarts -> STATE_DIVERGED
NO_OPTIMIZER = "no_optimizer"  # optimizer state not saved: a fresh Adam -> STATE_DIVERGED
NO_RNG = "no_rng"  # the global RNG (dropout masks) not restored -> STATE_DIVERGED
LOST_ACCUM = "lost_accum"  # gradients of a half-finished accumulation window not saved -> STATE_DIVERGED
BUGS = (NEVER_RESUMES, OLDER_CHECKPOINT, NO_SCHEDULER, NO_OPTIMIZER, NO_RNG, LOST_ACCUM)


def params(case: Mapping[str, Any]) -> dict[str, Any]:
    """The case with defaults filled in."""
    return {**DEFAULT_CASE, **{k: v for k, v in case.items() if k != "id"}}


def total_steps(case: Mapping[str, Any]) -> int:
    """Steps (micro-batches) of an uninterrupted run."""
    p = params(case)
    return math.ceil(p["n"] * p["epochs"] / p["take"])


def lr_factor(scheduler_step: int) -> float:
    """The schedule: the base rate times 0.7 per optimizer step taken."""
    return 0.7**scheduler_step


def step_folders(root: Path) -> list[Path]:
    """The ``step_N`` folders under ``root``, oldest step first."""
    folders = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(folders, key=lambda p: int(p.name[5:]))


def find_checkpoint(run: RunContext, bug: str | None = None) -> Path | None:
    """The checkpoint folder to resume from under the run's resume mode, or None to start fresh."""
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:
        if run.resume_path is None or not (run.resume_path / STATE_FILE).exists():
            raise FileNotFoundError(f"resume path {run.resume_path} holds no {STATE_FILE}")
        return run.resume_path
    assert run.resume_mode == RESUME_AUTO
    name = "checkpoint.pt" if bug == NEVER_RESUMES else STATE_FILE  # the bug looks for a file no save writes
    complete = [folder for folder in step_folders(run.checkpoint_dir) if (folder / name).exists()]
    if not complete:
        return None
    if bug == OLDER_CHECKPOINT and len(complete) > 1:
        return complete[-2]
    return complete[-1]


def train(run: RunContext, bug: str | None = None) -> None:
    """The loop. Correct when ``bug`` is None."""
    import torch

    p = params(run.case)
    n, take, accum = p["n"], p["take"], p["accum"]
    last = total_steps(run.case)
    data = torch.Generator().manual_seed(1234)  # the data never touches the global RNG
    rows = torch.randn(n, FEATURES, generator=data)
    targets = rows @ torch.randn(FEATURES, 1, generator=data)

    torch.manual_seed(run.seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    step, taken = 0, 0  # taken: inputs consumed over all epochs so far

    folder = find_checkpoint(run, bug)
    if folder is not None:
        saved = torch.load(folder / STATE_FILE, weights_only=True)
        model.load_state_dict(saved["model"])
        if saved["optimizer"]:  # as in many trainers: what the checkpoint lacks starts fresh
            optimizer.load_state_dict(saved["optimizer"])
        if saved["scheduler"]:
            scheduler.load_state_dict(saved["scheduler"])
        for param, grad in zip(model.parameters(), saved["grads"]):
            param.grad = grad
        step, taken = saved["step"], saved["taken"]
        if bug != NO_RNG:  # the bug keeps the freshly seeded generator
            torch.set_rng_state(saved["rng"])
    run.resumed(step, folder)

    while step < last:
        step += 1
        batch = list(range(taken, min(taken + take, n * p["epochs"])))
        taken += len(batch)
        for epoch in sorted({g // n for g in batch}):
            run.consumed([g % n for g in batch if g // n == epoch], step=step, epoch=epoch)
        index = torch.tensor([g % n for g in batch])
        loss = torch.nn.functional.mse_loss(model(rows[index]), targets[index]) / accum
        loss.backward()
        if step % accum == 0 or step == last:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()  # grads become None: the next window starts empty
        run.step_end(step)
        if run.should_checkpoint(step):
            grads = [param.grad for param in model.parameters()]
            path = save(run.checkpoint_dir, step, {
                "model": model.state_dict(),
                "optimizer": {} if bug == NO_OPTIMIZER else optimizer.state_dict(),
                "scheduler": {} if bug == NO_SCHEDULER else scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "grads": [None] * len(grads) if bug == LOST_ACCUM else grads,
                "step": step,
                "taken": taken,
            })
            run.checkpoint_published(step, path)
        # Everything that decides the rest of the run, by component (a None grad: nothing accumulated).
        run.state(step, {
            "model": model, "optimizer": optimizer, "scheduler": scheduler, "rng": torch.get_rng_state(),
            "grad_accum": [param.grad for param in model.parameters()],
            "data": {"epoch": taken // n, "position": taken % n},
        })
    if step == last:
        torch.save(model.state_dict(), run.checkpoint_dir / FINAL_FILE)


def save(root: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``step_N/state.pt`` durably (tmp, fsync, rename, fsync of the folders), then delete all but
    the newest ``KEEP`` step folders. Auto resume only takes a folder whose ``state.pt`` exists."""
    import torch

    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    for directory in (folder, root):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for old in step_folders(root)[:-KEEP]:
        shutil.rmtree(old)
    return folder


# One module-level function per variant: a child process imports its target by name.
def correct(run: RunContext) -> None:
    """The control: everything saved and restored."""
    train(run)


def never_resumes(run: RunContext) -> None:
    train(run, NEVER_RESUMES)


def older_checkpoint(run: RunContext) -> None:
    train(run, OLDER_CHECKPOINT)


def no_scheduler(run: RunContext) -> None:
    train(run, NO_SCHEDULER)


def no_optimizer(run: RunContext) -> None:
    train(run, NO_OPTIMIZER)


def no_rng(run: RunContext) -> None:
    train(run, NO_RNG)


def lost_accum(run: RunContext) -> None:
    train(run, LOST_ACCUM)
