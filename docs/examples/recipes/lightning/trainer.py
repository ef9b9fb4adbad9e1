"""A PyTorch Lightning regression trainer, as its authors wrote it: nothing here knows about
pytest-resume-check (conftest.py holds the glue).

Train, with a checkpoint every 5 steps (``ckpts/step_5.ckpt``, ...), then resume from the newest one or
from a given one:

    python trainer.py --checkpoint-dir ckpts
    python trainer.py --checkpoint-dir ckpts --resume latest
    python trainer.py --checkpoint-dir ckpts --resume ckpts/step_5.ckpt

The loader is torchdata's ``StatefulDataLoader``: Lightning saves its position in each checkpoint and
restores it, so a resume continues inside the epoch instead of starting it over.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

INPUTS = 40
BATCH_SIZE = 8


class Points(Dataset):
    """Noisy samples of a fixed linear function; each item carries its index."""

    def __init__(self, n: int = INPUTS):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i], "index": i}


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint in ``checkpoint_dir``: ``step_N.ckpt`` with the highest N (None when there is none)."""
    names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
    steps = {int(m.group(1)): name for name in names if (m := re.fullmatch(r"step_(\d+)\.ckpt", name))}
    return os.path.join(checkpoint_dir, steps[max(steps)]) if steps else None


def train(*, epochs: int = 2, shuffle: bool = True, seed: int = 0, ckpt_path: str | os.PathLike[str] | None = None,
          checkpoint_dir: str | None = None, callbacks: Iterable[Callback] = (), **trainer_options: Any) -> L.Trainer:
    """Fit the regressor; resume from ``ckpt_path`` if given. ``checkpoint_dir`` keeps a checkpoint every
    5 steps, ``step_N.ckpt``; ``trainer_options`` go to ``L.Trainer``."""
    L.seed_everything(seed)
    loader = StatefulDataLoader(Points(), batch_size=BATCH_SIZE, shuffle=shuffle)
    callbacks = list(callbacks)
    if checkpoint_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=checkpoint_dir, filename="step_{step}", auto_insert_metric_name=False,
                                         every_n_train_steps=5, save_top_k=-1))
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, enable_checkpointing=checkpoint_dir is not None,
                        **trainer_options)
    trainer.fit(Regressor(), loader, ckpt_path=ckpt_path)
    return trainer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", help="a checkpoint file, or 'latest': the newest in --checkpoint-dir")
    args = vars(parser.parse_args())
    resume = args.pop("resume")
    train(**args, ckpt_path=latest_checkpoint(args["checkpoint_dir"]) if resume == "latest" else resume)
