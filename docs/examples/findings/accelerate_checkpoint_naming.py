"""Accelerate's automatic checkpoint naming does not continue past the checkpoint ``load_state`` restored.

A job saves ``checkpoint_0`` and ``checkpoint_1``, is killed, and a new process resumes with
``load_state()``. Its ``project_configuration.iteration`` is still 0, so its next ``save_state()``:

* without ``total_limit`` fails: ``Checkpoint directory .../checkpoint_0 (0) already exists``;
* with ``total_limit=2`` first deletes the oldest folder (``checkpoint_0``) and then writes the new,
  newest state as ``checkpoint_0``. After the next kill, ``load_state()`` takes the highest number,
  ``checkpoint_1``: an older state, and training silently goes back.

Run it: ``python accelerate_checkpoint_naming.py``. Each process is a real new interpreter. It prints what
each variant did and exits with status 1 while the bug is there (accelerate 1.15.0), 0 once it is fixed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration


class Step:
    """The training step, saved with each checkpoint (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def job(project_dir: str, limit: int | None, resume: bool, saves: int) -> None:
    """One process of the job: optionally resume, then train and save ``saves`` times."""
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=limit))
    step = Step()
    accelerator.register_for_checkpointing(step)
    accelerator.prepare(torch.nn.Linear(2, 1))
    if resume:
        accelerator.load_state()
        print(f"  resumed at step {step.value}; project_configuration.iteration = "
              f"{accelerator.project_configuration.iteration}")
    for _ in range(saves):
        step.value += 1
        try:
            folder = accelerator.save_state()
        except ValueError as exc:
            print(f"  save at step {step.value} failed: {exc}")
            sys.exit(1)
        print(f"  saved step {step.value} as {folder.name}")


def process(*args: str) -> int:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    print(done.stdout, end="")
    return done.returncode


def main() -> int:
    buggy = False
    with tempfile.TemporaryDirectory() as out:
        print("without total_limit: train (2 saves), then resume and save")
        process("job", out + "/a", "none", "0", "2")
        buggy |= process("job", out + "/a", "none", "1", "1") != 0
    with tempfile.TemporaryDirectory() as out:
        print("total_limit=2: train (2 saves), resume and save, then resume again")
        process("job", out, "2", "0", "2")
        process("job", out, "2", "1", "1")
        marker = out + "/resumed-step.txt"
        process("resumed-step", out, marker)
        with open(marker) as f:
            resumed = int(f.read())
        buggy |= resumed != 3
        print(f"  the last resume restored step {resumed}; the newest checkpoint holds step 3")
    return 1 if buggy else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        _, _, folder, limit, resume, saves = sys.argv
        job(folder, None if limit == "none" else int(limit), resume == "1", int(saves))
    elif sys.argv[1:2] == ["resumed-step"]:
        _, _, folder, marker = sys.argv
        acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=folder,
                                                                        automatic_checkpoint_naming=True))
        restored = Step()
        acc.register_for_checkpointing(restored)
        acc.prepare(torch.nn.Linear(2, 1))
        acc.load_state()
        with open(marker, "w") as f:
            f.write(str(restored.value))
    else:
        sys.exit(main())
