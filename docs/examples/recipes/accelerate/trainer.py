"""A Hugging Face Accelerate regression trainer, as its authors wrote it: nothing here knows about
pytest-resume-check (conftest.py holds the glue).

Train with a checkpoint every 2 optimizer steps, kill it, and resume from the newest checkpoint (if there
is one yet; Accelerate's ``load_state()`` picks the highest-numbered folder):

    python trainer.py --output_dir out --checkpointing_steps 2
    python trainer.py --output_dir out --checkpointing_steps 2 --resume_from_checkpoint latest

Checkpoints are ``accelerator.save_state`` folders (``out/checkpoints/checkpoint_<n>``, the newest
``--checkpoint_limit`` kept). A resume skips the batches already trained on in one of two ways:
the loader's own state (``--stateful_dataloader``, saved by ``save_state``) or
``accelerator.skip_first_batches`` with the count kept in the registered ``Progress`` object.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, Dataset

INPUTS = 12


class Points(Dataset):
    """Noisy samples of a fixed linear function; each row carries its index as ``idx``."""

    def __init__(self, n: int = INPUTS):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 3, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.01 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return {"x": self.x[idx], "y": self.y[idx], "idx": idx}


class Progress:
    """Where training is, saved with every checkpoint (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step, self.epoch, self.batches = 0, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.step, self.epoch, self.batches = state["step"], state["epoch"], state["batches"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", default="out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--stateful_dataloader", action="store_true", help="else skip_first_batches on resume")
    parser.add_argument("--checkpointing_steps", default=None, help="N optimizer steps, or 'epoch'")
    parser.add_argument("--checkpoint_limit", type=int, default=None, help="keep only the newest N")
    parser.add_argument("--resume_from_checkpoint", default=None,
                        help="a checkpoint folder, or 'latest': the newest, if there is one yet")
    return parser.parse_args(argv)


def num_update_steps_per_epoch(args: argparse.Namespace) -> int:
    """Optimizer steps per epoch (Accelerate also steps on a short accumulation at an epoch's end)."""
    return math.ceil(math.ceil(INPUTS / args.batch_size) / args.gradient_accumulation_steps)


def build_accelerator(args: argparse.Namespace) -> Accelerator:
    return Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        # A seedable sampler and set_epoch() make the shuffle a function of (seed, epoch), so a resumed
        # run continues the same order; the default sampler draws it from the RNG when iteration starts.
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=args.stateful_dataloader,
                                                  use_seedable_sampler=True),
        project_config=ProjectConfiguration(project_dir=args.output_dir, automatic_checkpoint_naming=True,
                                            total_limit=args.checkpoint_limit),
    )


def training_function(accelerator: Accelerator, args: argparse.Namespace) -> None:
    set_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    total = num_update_steps_per_epoch(args) * args.num_train_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    # The loader's own generator keeps its seed draws off the global RNG that load_state restores.
    loader = DataLoader(Points(), batch_size=args.batch_size, shuffle=args.shuffle,
                        generator=torch.Generator().manual_seed(args.seed))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    saved = os.path.join(args.output_dir, "checkpoints")
    folders = os.listdir(saved) if os.path.isdir(saved) else []  # a resume into a new output_dir starts at 0
    latest = args.resume_from_checkpoint == "latest"
    if (latest and folders) or (args.resume_from_checkpoint and not latest):
        accelerator.load_state(None if latest else args.resume_from_checkpoint)  # None: the highest-numbered
        accelerator.print(f"resumed from {args.resume_from_checkpoint} at step {progress.step}")
        # Accelerate does not move its checkpoint numbering past what it loaded (the next save_state would
        # write checkpoint_0 again): continue after the newest folder.
        accelerator.project_configuration.iteration = 1 + max((int(f.split("_")[-1]) for f in folders), default=-1)
    if progress.batches == len(loader):  # saved after an epoch's last batch, before the epoch was closed
        progress.epoch, progress.batches = progress.epoch + 1, 0
    first_epoch, skip = progress.epoch, progress.batches
    every = args.checkpointing_steps or ""  # "N" optimizer steps, "epoch" or nothing

    for epoch in range(first_epoch, args.num_train_epochs):
        model.train()
        loader.set_epoch(epoch)
        batches = loader
        if epoch == first_epoch and skip and not args.stateful_dataloader:
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
                if every.isdigit() and progress.step % int(every) == 0:
                    accelerator.save_state()
        progress.epoch, progress.batches = epoch + 1, 0
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
        if every == "epoch":
            accelerator.save_state()
    accelerator.end_training()


def main() -> None:
    args = parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    training_function(build_accelerator(args), args)


if __name__ == "__main__":
    main()
