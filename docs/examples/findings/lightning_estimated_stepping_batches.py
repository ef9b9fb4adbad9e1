"""Lightning 2.6: a ``configure_optimizers`` that reads ``trainer.estimated_stepping_batches`` (as one does for
``OneCycleLR(total_steps=...)``) keeps ``Trainer.fit(ckpt_path=...)`` from restoring a ``StatefulDataLoader``'s
position: resumed in the middle of an epoch, the fit starts the epoch's data over (Lightning-AI/pytorch-lightning
#20550).

Run it: ``python lightning_estimated_stepping_batches.py``. It prints the ids an uninterrupted fit trains after
step 3 and those a fit resumed from ``step=3.ckpt`` trains, with and without the call, and exits with status 1
while the resumed fit that makes the call differs (Lightning 2.6.6), 0 once it agrees.
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
from torchdata.stateful_dataloader import StatefulDataLoader

INPUTS = 40
BATCH = 8  # five steps per epoch


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return INPUTS

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2,), float(i)), "id": i}


class Model(L.LightningModule):
    def __init__(self, estimate: bool) -> None:
        super().__init__()
        self.estimate = estimate
        self.layer = torch.nn.Linear(2, 1)
        self.trained: list[int] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.trained.extend(batch["id"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.estimate:
            self.trainer.estimated_stepping_batches  # noqa: B018  (what an OneCycleLR set-up reads)
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit(estimate: bool, folder: Path, ckpt_path: str | None = None) -> list[int]:
    model = Model(estimate)
    every_3_steps = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(max_epochs=1, callbacks=[every_3_steps], logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, StatefulDataLoader(Rows(), batch_size=BATCH), ckpt_path=ckpt_path)
    return model.trained


def main() -> int:
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    differ = False
    for estimate in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            straight = fit(estimate, Path(tmp))  # writes step=3.ckpt after 24 inputs
            resumed = fit(estimate, Path(tmp) / "resumed", ckpt_path=str(Path(tmp) / "step=3.ckpt"))
        print(f"configure_optimizers reads estimated_stepping_batches: {estimate}")
        print("  after step 3, uninterrupted:       ", straight[3 * BATCH:])
        print("  after step 3, resumed from step=3: ", resumed)
        differ |= estimate and resumed != straight[3 * BATCH:]
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
