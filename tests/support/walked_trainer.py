"""A torch trainer kept in one object whose state is reported with ``state_of(trainer)``: nobody lists
its components, so an EMA model it forgets to save is found all the same.

``Trainer`` holds a small model, an EMA copy of it (updated after every step, never fed back into
training), SGD with momentum, a ``StepLR`` schedule, a data position and the step; and things that are
no state and must not be reported: its output folder, a lock, a logger, the run context. A checkpoint
(``step_N/state.pt``, tmp + fsync + rename, then ``latest``) holds model, EMA, optimizer, schedule,
position and step; planted bug ``no_ema`` leaves the EMA out, so a resume restarts it from the
initial weights. torch is imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from pathlib import Path
from typing import Any

from pytest_resume_check import state_of
from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

N_INPUTS = 6
EPOCHS = 2
FEATURES = 3
EMA_DECAY = 0.8
STATE_FILE = "state.pt"
LATEST = "latest"
NO_EMA = "no_ema"


def total_steps(case: Any = None) -> int:
    return N_INPUTS * EPOCHS


class Trainer:
    def __init__(self, run: RunContext):
        import torch

        torch.manual_seed(run.seed)
        self.model = torch.nn.Linear(FEATURES, 1)
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=4, gamma=0.5)
        self.position = 0  # inputs taken over all epochs
        self.step = 0
        self.output_dir = str(run.checkpoint_dir)  # differs between runs by design: skipped
        self.lock = threading.Lock()
        self.log = logging.getLogger("walked_trainer")
        self.run = run

    def train_step(self) -> tuple[int, int]:
        """One input a step; returns (its id, its epoch)."""
        import torch

        index, epoch = self.position % N_INPUTS, self.position // N_INPUTS
        x = torch.arange(FEATURES, dtype=torch.float32) * (index + 1) / N_INPUTS
        loss = self.model(x).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            for average, param in zip(self.ema_model.parameters(), self.model.parameters()):
                average.lerp_(param, 1 - EMA_DECAY)
        self.position += 1
        self.step += 1
        return index, epoch

    def save(self, bug: str | None) -> Path:
        import torch

        folder = Path(self.output_dir) / f"step_{self.step}"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "position": self.position, "step": self.step,
                 "ema": {} if bug == NO_EMA else self.ema_model.state_dict()}
        tmp = folder / (STATE_FILE + ".tmp")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / STATE_FILE)
        pointer = Path(self.output_dir) / (LATEST + ".tmp")
        pointer.write_text(folder.name)
        os.replace(pointer, Path(self.output_dir) / LATEST)
        return folder

    def load(self, folder: Path) -> None:
        import torch

        saved = torch.load(folder / STATE_FILE, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if saved["ema"]:
            self.ema_model.load_state_dict(saved["ema"])
        self.position, self.step = saved["position"], saved["step"]


def _checkpoint(run: RunContext) -> Path | None:
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:
        return run.resume_path
    latest = run.checkpoint_dir / LATEST
    return run.checkpoint_dir / latest.read_text().strip() if latest.exists() else None


def train(run: RunContext, bug: str | None = None) -> None:
    trainer = Trainer(run)
    folder = _checkpoint(run)
    if folder is not None:
        trainer.load(folder)
    run.resumed(trainer.step, folder)

    def report() -> None:
        run.state(trainer.step, state_of(trainer, skip="output_dir"))

    if folder is not None:
        report()  # what the checkpoint restored
    while trainer.step < total_steps():
        index, epoch = trainer.train_step()
        run.consumed([index], step=trainer.step, epoch=epoch)
        run.step_end(trainer.step)
        if run.should_checkpoint(trainer.step):
            run.checkpoint_published(trainer.step, trainer.save(bug))
        report()


def correct(run: RunContext) -> None:
    train(run)


def no_ema(run: RunContext) -> None:
    train(run, NO_EMA)
