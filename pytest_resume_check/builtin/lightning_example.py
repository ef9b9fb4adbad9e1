"""A PyTorch Lightning trainer driven through :class:`pytest_resume_check.integrations.lightning.LightningResumeCheck`.

The trainer is what a Lightning user writes: a ``LightningModule`` (a small MLP regressor, Adam and a
per-step ``StepLR``) fitted on synthetic data from a torchdata ``StatefulDataLoader``, whose position
Lightning saves in its checkpoints and restores on ``trainer.fit(..., ckpt_path=...)``. The trainer chooses
that checkpoint itself (:func:`checkpoint_to_resume`: the ``step_N.ckpt`` of the highest step, the run's
``resume_path``, or none), so the matrix tests its choice. The callback reports the batches, ends a step on
each optimizer step, checkpoints when the harness asks (as ``step_N.ckpt``) and reports the training state
and the checkpoint Lightning restored.

Case keys: ``n`` inputs, ``batch`` size, ``epochs``, ``accumulate`` (``accumulate_grad_batches``),
``shuffle``, ``workers`` (loader worker processes), ``keep_last`` (checkpoints kept), ``fix_epoch_end``
(the trainer adds :class:`~pytest_resume_check.integrations.lightning.EpochEndResumeFix`, the opt-in
workaround for the bug below).

A Lightning bug shows in this example (docs/findings.md, "Lightning: a checkpoint at an epoch's last
batch skips the next epoch"): resumed from a checkpoint written at the last batch of an epoch that is
not the last, ``fit`` trains nothing in the next epoch. Those cells are declared expected failures,
except in the case whose trainer carries the workaround.

Planted bugs (module-level targets, not in ``TARGETS``): :func:`fit_plain_loader` trains from a plain
``torch.utils.data.DataLoader``, whose position Lightning cannot save; :func:`fit_fresh_optimizer`
drops the optimizer state when a checkpoint is loaded; :func:`fit_name_sorted_resume` takes the newest
checkpoint as the last file name in sorted order, so ``step_9.ckpt`` wins over ``step_10.ckpt``.

Lightning, torch and torchdata are imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from pytest_resume_check.builtin.epochs import AccumulatedEpochs
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext, RunPlan
from pytest_resume_check.targets import resume_target

FEATURES = 4
ID_KEY = "input_id"
DEFAULT_CASE = {"n": 40, "batch": 8, "epochs": 2, "accumulate": 1, "shuffle": False, "workers": 0,
                "keep_last": None, "fix_epoch_end": False}

#: Planted bugs.
PLAIN_LOADER = "plain_loader"  # torch.utils.data.DataLoader: no loader state in the checkpoint -> DUPLICATED/LOST
FRESH_OPTIMIZER = "fresh_optimizer"  # the optimizer state is dropped on load -> STATE_DIVERGED
NAME_SORTED = "name_sorted"  # the newest checkpoint by file name: step_9.ckpt after step_10.ckpt -> STALE_RESUME

#: The trainer's checkpoints: ``step_N.ckpt`` (N: the optimizer step), the name LightningResumeCheck gives the ones the
#: harness asks for.
CHECKPOINT_NAME = re.compile(r"step_(\d+)\.ckpt")


#: The case's step counts (pytest_resume_check.builtin.epochs).
_EPOCHS = AccumulatedEpochs(DEFAULT_CASE, "accumulate")
params, steps_per_epoch = _EPOCHS.params, _EPOCHS.steps_per_epoch
total_steps, epoch_boundaries = _EPOCHS.total_steps, _EPOCHS.epoch_boundaries


class Synthetic:
    """Map-style dataset: ``{"x", "y", "input_id"}`` rows of a fixed noisy linear function (module level,
    so loader workers can use it)."""

    def __init__(self, n: int):
        import torch

        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 0.25]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index], ID_KEY: index}


@functools.cache
def regressor_class() -> type:
    """The LightningModule (defined on first use, so that importing this module does not import Lightning)."""
    import lightning.pytorch as L
    import torch

    class Regressor(L.LightningModule):
        """A small MLP regressor trained with Adam and a per-step StepLR, as a Lightning user writes one."""

        def __init__(self, lr: float = 0.02):
            super().__init__()
            self.lr = lr
            self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> Any:
            return torch.nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Regressor


@functools.cache
def fresh_optimizer_class() -> type:
    """Planted bug: the module drops the saved optimizer state, a habit copied from fine-tuning recipes
    ("start the optimizer afresh on resume"). Lightning then restores nothing into the optimizer."""

    # The base is made at first use (importing this module must not import Lightning), so mypy cannot see it.
    class FreshOptimizerRegressor(regressor_class()):  # type: ignore[misc]
        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["optimizer_states"] = []

    return FreshOptimizerRegressor


def make_loader(p: Mapping[str, Any], stateful: bool = True) -> Any:
    """The training loader: torchdata's StatefulDataLoader (Lightning saves and restores its position),
    or a plain DataLoader (it cannot)."""
    from torch.utils.data import DataLoader, Dataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    cls = StatefulDataLoader if stateful else DataLoader
    # A map-style dataset by duck typing, as DataLoader takes one; typed as torch's Dataset, which it does not
    # subclass so that importing this module does not import torch.
    dataset = cast("Dataset[dict[str, Any]]", Synthetic(p["n"]))
    return cls(dataset, batch_size=p["batch"], shuffle=bool(p["shuffle"]), num_workers=int(p["workers"]),
               persistent_workers=False)


def latest_checkpoint(folder: Path) -> Path | None:
    """The trainer's own "which checkpoint": the ``step_N.ckpt`` in ``folder`` with the highest step (None: none
    yet, a fresh start)."""
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.ckpt") if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return max(found)[1] if found else None


def latest_by_name(folder: Path) -> Path | None:
    """Planted bug: the newest checkpoint taken as the last name in sorted order, as ``sorted(glob(...))[-1]``
    does. Right up to step 9; from step 10 on ``step_10.ckpt`` sorts before ``step_9.ckpt`` (and ``step_2.ckpt``)."""
    names = sorted(p.name for p in folder.glob("step_*.ckpt"))
    return folder / names[-1] if names else None


def checkpoint_to_resume(run: RunContext, latest: Callable[[Path], Path | None] = latest_checkpoint) -> str | None:
    """What the trainer passes to ``trainer.fit(ckpt_path=...)`` under the run's resume mode: ``latest`` of the
    checkpoint folder (``auto``), the checkpoint it was given (``path``), or none (``disabled``)."""
    if run.resume_mode == RESUME_PATH:
        return str(run.resume_path)
    found = latest(run.checkpoint_dir) if run.resume_mode == RESUME_AUTO else None
    return str(found) if found is not None else None


def make_trainer(p: Mapping[str, Any], callbacks: list[Any]) -> Any:
    """The Trainer: ``epochs`` epochs on the CPU, with what the harness does not need switched off."""
    import lightning.pytorch as L

    return L.Trainer(
        max_epochs=p["epochs"],
        accumulate_grad_batches=p["accumulate"],
        callbacks=callbacks,
        accelerator="cpu",
        devices=1,
        # Start-up costs and files nobody reads here.
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def fit(run: RunContext, bug: str | None = None) -> None:
    """Fit the regressor for ``epochs`` epochs, resuming as the run's resume mode says."""
    import lightning.pytorch as L

    from pytest_resume_check.integrations.lightning import EpochEndResumeFix, LightningResumeCheck

    p = params(run.case)
    L.seed_everything(run.seed, verbose=False)
    model = (fresh_optimizer_class() if bug == FRESH_OPTIMIZER else regressor_class())()
    loader = make_loader(p, stateful=bug != PLAIN_LOADER)
    check = LightningResumeCheck(run, ids=lambda batch: batch[ID_KEY], keep_last=p["keep_last"])
    trainer = make_trainer(p, [check, EpochEndResumeFix()] if p["fix_epoch_end"] else [check])
    resume = checkpoint_to_resume(run, latest_by_name if bug == NAME_SORTED else latest_checkpoint)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)  # check reports what Lightning restored


# One module-level function per variant: a child process imports its target by name.
def fit_example(run: RunContext) -> None:
    """Lightning Trainer.fit over a StatefulDataLoader, reported by the LightningResumeCheck callback."""
    fit(run)


def fit_plain_loader(run: RunContext) -> None:
    """Planted bug: a plain DataLoader; resumed mid-epoch, Lightning restarts the epoch's data."""
    fit(run, PLAIN_LOADER)


def fit_fresh_optimizer(run: RunContext) -> None:
    """Planted bug: the optimizer state is dropped when the checkpoint is loaded."""
    fit(run, FRESH_OPTIMIZER)


def fit_name_sorted_resume(run: RunContext) -> None:
    """Planted bug: the trainer resumes from the last checkpoint name in sorted order (step_9 after step_10)."""
    fit(run, NAME_SORTED)


def warm_up() -> None:
    """Fit two steps and save once (in the fork server), so that forked runs start with Lightning, Adam and
    torch.save initialised."""
    import tempfile

    class _Discard:
        def send(self, event: Any) -> None:
            pass

    with tempfile.TemporaryDirectory() as tmp:
        plan = RunPlan("warm-up", ("", "", ""), {"n": 4, "batch": 2, "epochs": 1}, 0, tmp, os.devnull,
                       resume_mode=RESUME_DISABLED, checkpoint_steps=frozenset({1}))
        fit(RunContext(plan, _Discard()))


def after_last_batch_of_an_epoch(cell: Any) -> bool:
    """A resume from a checkpoint written at the last batch of an epoch that is not the fit's last, by a
    trainer without the workaround: Lightning 2.6 skips the next epoch."""
    if params(cell.case)["fix_epoch_end"]:
        return False
    inner = set(epoch_boundaries(cell.case)[:-1])
    return any(kill.checkpoint_step in inner for kill in cell.kills)


LIGHTNING_EPOCH_SKIP = ("Lightning 2.6 bug: resumed from a checkpoint written at an epoch's last batch, fit skips the "
                        "next epoch with a stateful loader (docs/findings.md: \"Lightning: a checkpoint at an epoch's "
                        "last batch skips the next epoch\")")

#: Two epochs of inputs in batches of 8. 40 inputs: five steps per epoch (three under accumulate_grad_batches=2:
#: 2 + 2 + 1 batches, as Lightning steps on an epoch's last batch). The case with loader workers is the slow
#: one: 24 inputs, three steps per epoch, and the trainer carries the epoch-end workaround.
CASES = (
    {"id": "e2-keep2", "keep_last": 2},
    {"id": "e2-shuffle-accum2", "shuffle": True, "accumulate": 2},
    {"id": "e2-shuffle-w2-fix", "n": 24, "shuffle": True, "workers": 2, "fix_epoch_end": True},
)

#: PyTorch Lightning's Trainer.fit over a StatefulDataLoader with the LightningResumeCheck callback.
lightning_example = resume_target(
    fit_example,
    name="lightning_example",
    steps=total_steps,
    boundaries=epoch_boundaries,
    cases=CASES,
    contract="exactly_once_ordered",
    preload=("torch", "torchdata.stateful_dataloader", "lightning.pytorch",
             "pytest_resume_check.integrations.lightning", "pytest_resume_check.builtin.lightning_example:warm_up"),
    expected_failures=[(after_last_batch_of_an_epoch, LIGHTNING_EPOCH_SKIP)],
)


def _has_lightning() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "torchdata", "lightning"))


#: Only offered where Lightning, torch and torchdata are installed.
TARGETS = [lightning_example] if _has_lightning() else []
