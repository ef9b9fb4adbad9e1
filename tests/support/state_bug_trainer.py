"""A small real torch trainer with planted *state* bugs, for the harness's own tests.

An MLP with dropout (so the global torch RNG decides the run), Adam, a ``LambdaLR`` schedule, a loss
scaler (``torch.amp.GradScaler`` on the CPU: its scale grows every ``GROWTH_INTERVAL`` updates, so its
state changes over the run), an EMA of the weights (updated after every optimizer step, never fed back
into training: an output of the job) and gradient accumulation: each harness step is one micro-batch
of ``take`` fixed feature rows (ids are row indices, in order, for ``epochs`` epochs) and the optimizer
steps every ``accum`` micro-batches. A checkpoint (``step_N/state.pt``, written through tmp + fsync +
rename, the newest ``KEEP`` folders kept) holds everything that decides the rest of the run: model,
optimizer, scheduler, EMA, loss scaler, global RNG, the gradients of a half-finished accumulation
window, the data position and the step.

After every step the trainer reports that state by component (``run.state``: model, optimizer,
scheduler, rng, grad_accum, data, ema, scaler), and once more right after restoring a checkpoint (what
it gave back, compared with the reference's state at the restored step). A run that reaches the last
step reports what the job delivers (``run.final``: model and EMA) and writes those weights to
``final.pt`` in its checkpoint directory (``model.<key>`` and ``ema.<key>`` tensors: the tests' oracle,
independent of the digests).

The scaler's scale is a power of two, so scaling and unscaling the gradients is exact: the scale
changes no update unless the gradients of one window were scaled by different scales (a window resumed
with another scale than it started with).

The scheduler is a ``LambdaLR`` on purpose: its learning rate is a function of its own step count.
A chainable scheduler (``StepLR``, ``ExponentialLR``) multiplies the optimizer's restored rate, so a
forgotten scheduler state could leave every later rate right (or wrong only by a phase): the weights
would not show the bug that the state shows.

The ``bug`` argument plants one bug, each a one-line deviation beside the correct line. Case keys:
``n`` rows, ``take`` rows per step, ``epochs``, ``accum`` micro-batches per optimizer step, ``final``
(False: no ``run.final``; a target whose reference reports final outputs is never stopped early, one
without them may stop a resumed run whose state meets the reference's at an epoch's end).
torch and numpy are imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import copy
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
#: The EMA keeps this much of itself at every optimizer step.
EMA_DECAY = 0.9
#: The loss scaler's first scale, and how many updates without an inf or NaN gradient double it.
INIT_SCALE = 2.0**10
GROWTH_INTERVAL = 2
#: The standard deviation of the ``numpy_noise`` bug's input noise.
NOISE = 0.1
DEFAULT_CASE = {"n": 8, "take": 2, "epochs": 2, "accum": 2, "final": True}

#: Planted bugs.
NEVER_RESUMES = "never_resumes"  # auto resume looks for a file no save writes: always from scratch -> STALE_RESUME
OLDER_CHECKPOINT = "older_checkpoint"  # auto resume takes the older of the kept folders -> STALE_RESUME
NO_SCHEDULER = "no_scheduler"  # scheduler state not saved: the schedule restarts -> STATE_DIVERGED
NO_OPTIMIZER = "no_optimizer"  # optimizer state not saved: a fresh Adam -> STATE_DIVERGED
NO_RNG = "no_rng"  # the global RNG (dropout masks) not restored -> STATE_DIVERGED
LOST_ACCUM = "lost_accum"  # gradients of a half-finished accumulation window not saved -> STATE_DIVERGED
NO_EMA = "no_ema"  # EMA weights not saved: the restored EMA restarts from the initial weights -> STATE_DIVERGED
NO_SCALER = "no_scaler"  # loss-scaler state not saved: scale and growth tracker restart -> STATE_DIVERGED
SAVE_BEFORE_STEP = "save_before_step"  # step k's checkpoint is captured before step k's update -> STATE_DIVERGED
NUMPY_NOISE = "numpy_noise"  # input noise from numpy's global generator, which no checkpoint saves; its target
#                              reports no state: only the generator the harness captures shows it -> STATE_DIVERGED
EMA_FINAL_ONLY = "ema_final_only"  # EMA not saved, and reported only in run.final (per step: the docs' example
#                                    components, no ema): only the final outputs show it -> STATE_DIVERGED
BUGS = (NEVER_RESUMES, OLDER_CHECKPOINT, NO_SCHEDULER, NO_OPTIMIZER, NO_RNG, LOST_ACCUM, NO_EMA, NO_SCALER,
        SAVE_BEFORE_STEP, NUMPY_NOISE, EMA_FINAL_ONLY)
#: The per-step components the trainer reports (``ema_final_only``: the first six, the docs' example).
COMPONENTS = ("model", "optimizer", "scheduler", "rng", "grad_accum", "data", "ema", "scaler")


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


def train(run: RunContext, bug: str | None = None, report: bool = True) -> None:
    """The loop. Correct when ``bug`` is None. ``report=False``: neither ``run.state`` nor ``run.final``
    (the generators the harness captures at each step end are all there is to compare)."""
    import numpy as np
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
    ema = copy.deepcopy(model).requires_grad_(False)  # the average starts at the initial weights
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    if bug == NUMPY_NOISE:  # the bug's augmentation draws from numpy's global generator, seeded here only
        np.random.seed(run.seed)
    step, taken = 0, 0  # taken: inputs consumed over all epochs so far

    def components() -> dict[str, Any]:
        """Everything that decides the rest of the run, by component (a None grad: nothing accumulated)."""
        out = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "rng": torch.get_rng_state(),
               "grad_accum": [param.grad for param in model.parameters()],
               "data": {"epoch": taken // n, "position": taken % n}, "ema": ema, "scaler": scaler}
        return {k: out[k] for k in COMPONENTS[:6]} if bug == EMA_FINAL_ONLY else out  # the bug: no ema, no scaler

    def checkpoint() -> dict[str, Any]:
        """What the checkpoint of this step holds: a copy, which later updates cannot change."""
        grads = [param.grad for param in model.parameters()]
        return copy.deepcopy({
            "model": model.state_dict(),
            "optimizer": {} if bug == NO_OPTIMIZER else optimizer.state_dict(),
            "scheduler": {} if bug == NO_SCHEDULER else scheduler.state_dict(),
            "ema": {} if bug in (NO_EMA, EMA_FINAL_ONLY) else ema.state_dict(),
            "scaler": {} if bug == NO_SCALER else scaler.state_dict(),
            "rng": torch.get_rng_state(),
            "grads": [None] * len(grads) if bug == LOST_ACCUM else grads,
            "step": step,
            "taken": taken,
        })

    folder = find_checkpoint(run, bug)
    if folder is not None:
        saved = torch.load(folder / STATE_FILE, weights_only=True)
        model.load_state_dict(saved["model"])
        if saved["optimizer"]:  # as in many trainers: what the checkpoint lacks starts fresh
            optimizer.load_state_dict(saved["optimizer"])
        if saved["scheduler"]:
            scheduler.load_state_dict(saved["scheduler"])
        if saved["ema"]:
            ema.load_state_dict(saved["ema"])
        if saved["scaler"]:
            scaler.load_state_dict(saved["scaler"])
        for param, grad in zip(model.parameters(), saved["grads"]):
            param.grad = grad
        step, taken = saved["step"], saved["taken"]
        if bug != NO_RNG:  # the bug keeps the freshly seeded generator
            torch.set_rng_state(saved["rng"])
    run.resumed(step, folder)
    if folder is not None and report:  # what the checkpoint gave back: compared with the reference at this step
        run.state(step, components())

    while step < last:
        step += 1
        batch = list(range(taken, min(taken + take, n * p["epochs"])))
        taken += len(batch)
        for epoch in sorted({g // n for g in batch}):
            run.consumed([g % n for g in batch if g // n == epoch], step=step, epoch=epoch)
        index = torch.tensor([g % n for g in batch])
        inputs = rows[index]
        if bug == NUMPY_NOISE:  # augmentation from a generator that no checkpoint saves
            inputs = inputs + torch.from_numpy(np.random.normal(0.0, NOISE, tuple(inputs.shape))).float()
        loss = torch.nn.functional.mse_loss(model(inputs), targets[index]) / accum
        scaler.scale(loss).backward()
        early = checkpoint() if bug == SAVE_BEFORE_STEP else None  # the bug captures its checkpoint before the update
        if step % accum == 0 or step == last:
            scaler.step(optimizer)  # unscales the gradients, then steps (unless one is inf or NaN)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad()  # grads become None: the next window starts empty
            with torch.no_grad():  # the EMA follows the weights and never feeds back into training
                for average, param in zip(ema.parameters(), model.parameters()):
                    average.lerp_(param, 1 - EMA_DECAY)
        run.step_end(step)
        if run.should_checkpoint(step):
            path = save(run.checkpoint_dir, step, checkpoint() if early is None else early)
            run.checkpoint_published(step, path)
        if report:
            run.state(step, components())
    if step == last:
        weights = {"model": model.state_dict(), "ema": ema.state_dict()}
        torch.save({f"{name}.{key}": value for name, sd in weights.items() for key, value in sd.items()},
                   run.checkpoint_dir / FINAL_FILE)
        if report and p["final"]:
            run.final({"model": model, "ema": ema})


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


def no_ema(run: RunContext) -> None:
    train(run, NO_EMA)


def no_scaler(run: RunContext) -> None:
    train(run, NO_SCALER)


def save_before_step(run: RunContext) -> None:
    train(run, SAVE_BEFORE_STEP)


def numpy_noise(run: RunContext) -> None:
    """Reports no state and no final outputs: only the harness's own capture of numpy's generator."""
    train(run, NUMPY_NOISE, report=False)


def ema_final_only(run: RunContext) -> None:
    train(run, EMA_FINAL_ONLY)
