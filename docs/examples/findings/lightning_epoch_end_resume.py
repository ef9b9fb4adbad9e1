"""Lightning 2.6: resumed from a checkpoint that ``ModelCheckpoint(every_n_train_steps=...)`` wrote at the last
batch of an epoch, ``Trainer.fit`` trains nothing in the next epoch when the train loader is a torchdata
``StatefulDataLoader``. A plain ``DataLoader`` resumes correctly from the same kind of checkpoint.

Run it: ``python lightning_epoch_end_resume.py``. For each loader it prints the ids an uninterrupted fit
trains in epoch 1 and those a fit resumed from ``step=5.ckpt`` (the last batch of epoch 0) trains, and it
exits with status 1 while they differ (Lightning 2.6.6), 0 once they agree.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

INPUTS = 40
BATCH = 8  # five batches, so five optimizer steps, per epoch


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return INPUTS

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2,), float(i)), "id": i}


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.trained: dict[int, list[int]] = {}  # epoch -> ids trained on

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.trained.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit(loader_class: type, folder: Path, ckpt_path: str | None = None) -> dict[int, list[int]]:
    model = Model()
    every_5_steps = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=5, save_top_k=-1)
    trainer = L.Trainer(max_epochs=2, callbacks=[every_5_steps], logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader_class(Rows(), batch_size=BATCH), ckpt_path=ckpt_path)
    return model.trained


def main() -> int:
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    differ = False
    for loader_class in (StatefulDataLoader, DataLoader):
        with tempfile.TemporaryDirectory() as tmp:
            straight = fit(loader_class, Path(tmp))  # writes step=5.ckpt at the last batch of epoch 0
            resumed = fit(loader_class, Path(tmp) / "resumed", ckpt_path=str(Path(tmp) / "step=5.ckpt"))
        print(f"{loader_class.__name__}:")
        print("  epoch 1, uninterrupted:        ", straight.get(1, []))
        print("  epoch 1, resumed from step=5:  ", resumed.get(1, []))
        differ |= straight.get(1) != resumed.get(1)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
