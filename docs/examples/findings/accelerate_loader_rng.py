"""After ``accelerator.load_state``, randomness in training (dropout) differs from the uninterrupted run
when the DataLoader has no generator of its own.

``load_state`` restores the global torch RNG as it was at the checkpoint, in the middle of an epoch. The
resumed loop then starts iterating its loader, and a ``DataLoader`` without ``generator=`` draws its base
seed from that global RNG (it does so for every iterator, with or without workers). The uninterrupted run
drew it at the start of the epoch, before the checkpoint; the resumed run draws it again after, so every
later dropout mask, augmentation or sampling in the training process is shifted by one draw. Giving the
DataLoader its own ``torch.Generator`` keeps the draws off the global RNG.

Run it: ``python accelerate_loader_rng.py``. The job trains 3 batches; the resumed job is a new process
that loads the checkpoint taken after batch 1 (a stateful loader, so it continues with batch 2). It prints
the global RNG's next number after batch 2 in both, with and without a loader generator, and exits with
status 1 while they differ without one (accelerate 1.15.0, torch 2.13), 0 once they agree.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed


def job(out: str, generator: bool, mode: str) -> None:
    """``straight``: 2 batches; ``save``: 1 batch and save_state; ``resume``: load_state and 1 batch. Prints
    ``torch.rand(1)`` after batch 2 (what a dropout layer would draw)."""
    set_seed(0)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2,
                                         generator=torch.Generator().manual_seed(0) if generator else None)
    loader = accelerator.prepare(loader)
    if mode == "resume":
        accelerator.load_state(out)
    for taken, _batch in enumerate(loader, start=2 if mode == "resume" else 1):
        if mode == "save":
            accelerator.save_state(out)
            return
        if taken == 2:
            print(f"{torch.rand(1).item():.6f}")
            return


def draw(out: str, generator: bool, mode: str) -> str:
    done = subprocess.run([sys.executable, __file__, "job", out, str(int(generator)), mode], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def main() -> int:
    differs = {}
    for generator in (False, True):
        with tempfile.TemporaryDirectory() as out:
            straight = draw(out, generator, "straight")
            draw(out, generator, "save")
            resumed = draw(out, generator, "resume")
        differs[generator] = straight != resumed
        label = "DataLoader(generator=torch.Generator())" if generator else "DataLoader()                          "
        print(f"{label} after batch 2, uninterrupted: {straight}  resumed: {resumed}")
    return 1 if differs[False] else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        job(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
    else:
        sys.exit(main())
