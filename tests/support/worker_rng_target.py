"""A one-process trainer over a ``StatefulDataLoader`` with two workers whose dataset draws noise from
the worker's torch generator, for the early-stop rule's tests (tests/engine/test_early_stop_rule.py).

The trainer resumes exactly everything it can see: a checkpoint (``step_N/state.pt``, tmp + fsync +
rename, then ``latest``) holds the model, the optimizer (SGD with momentum), the loader's
``state_dict()`` as of the last batch taken, the epoch, the step and the global torch RNG; it reports
them all after every step and right after restoring (``run.state``). Its one flaw is torchdata's
(0.11, docs/findings.md "a mid-epoch resume restarts the loader workers' generators"): the workers of a
loader resumed in the middle of an epoch seed their generators again from the epoch's base seed, so the
samples after the resume get the noise of the epoch's first samples. No state the trainer can report
shows that (the loader's ``state_dict()`` is the same), only the weights trained on the noise do. At the
next epoch the loader starts new workers from a new base seed (drawn from the global RNG, which the
trainer restores): the hidden state is the same again from there.

Input i is ``features(i)`` plus, when the variant uses it, ``NOISE`` times the sample's noise. Two
variants, both "correct" but for torchdata's behaviour:

* ``noise_every_step``: the noise is used at every step: the model differs at the first resumed batch
  whose noise is another (the first one after the resume, but after a resume at the epoch's first batch,
  where worker 1 still makes its first batch: the second one).
* ``noise_every_third_step``: the noise is used only at steps divisible by 3: the model differs up to 3
  steps after a state that equals the reference's in every component.

Case keys: none (12 inputs, batches of 2, 2 epochs: 12 steps, epochs end at steps 6 and 12).
torch and torchdata are imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH, RunContext

N_INPUTS = 12
BATCH = 2
EPOCHS = 2
WORKERS = 2
FEATURES = 4
NOISE = 0.5
LATEST = "latest"
STATE_FILE = "state.pt"
#: Steps of an epoch (one loader batch a step).
PER_EPOCH = N_INPUTS // BATCH
#: Preloaded in the fork server (the optimizer imports torch._dynamo when first built: a second a run otherwise).
PRELOAD = ("torch", "torch._dynamo", "torchdata.stateful_dataloader")

EVERY_STEP = "every_step"
EVERY_THIRD_STEP = "every_third_step"


def total_steps(case: Any = None) -> int:
    return EPOCHS * PER_EPOCH


def epoch_boundaries(case: Any = None) -> list[int]:
    return [PER_EPOCH * (e + 1) for e in range(EPOCHS)]


def uses_noise(variant: str, step: int) -> bool:
    """Whether the update of ``step`` trains on the samples' noise."""
    return variant == EVERY_STEP or step % 3 == 0


def features(index: int) -> Any:
    import torch

    return (torch.arange(FEATURES, dtype=torch.float32) - 1.5) * (index + 1) / N_INPUTS


class NoisyInputs:
    """Map-style dataset: input i, its fixed features and noise drawn in the worker that loads it
    (module level, so loader workers can use it)."""

    def __len__(self) -> int:
        return N_INPUTS

    def __getitem__(self, index: int) -> Any:
        import torch

        return {"id": index, "x": features(index), "noise": torch.rand(FEATURES)}


def train(run: RunContext, variant: str) -> None:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(run.seed)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = StatefulDataLoader(NoisyInputs(), batch_size=BATCH, num_workers=WORKERS)
    step, epoch = 0, 0
    position: dict[str, Any] = {}  # the loader's state as of the last batch taken
    folder = _find_checkpoint(run)
    if folder is not None:
        saved = torch.load(folder / STATE_FILE, weights_only=True)  # tensors, numbers and dicts only
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        position, step, epoch = saved["loader"], saved["step"], saved["epoch"]
    run.resumed(step, folder)
    batches = iter(loader)  # draws a base seed from the global generator (the resumed one keeps the saved one)
    if folder is not None:
        torch.set_rng_state(saved["rng"])  # last: the iterator above drew from the generator

    def report(at: int) -> None:
        run.state(at, {"model": model, "optimizer": optimizer, "loader": position, "epoch": epoch,
                       "rng": torch.get_rng_state()})

    if folder is not None:
        report(step)  # what the checkpoint restored
    while epoch < EPOCHS:
        try:
            batch = next(batches)
        except StopIteration:
            epoch += 1
            if epoch < EPOCHS:
                batches = iter(loader)  # new workers, a new base seed from the global generator
            continue
        position = loader.state_dict()
        step += 1
        run.consumed(batch["id"].tolist(), step=step, epoch=epoch)
        x = batch["x"] + NOISE * batch["noise"] if uses_noise(variant, step) else batch["x"]
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.step_end(step)
        if run.should_checkpoint(step):
            path = _save(run.checkpoint_dir, step, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": position,
                "step": step, "epoch": epoch, "rng": torch.get_rng_state(),
            })
            run.checkpoint_published(step, path)
        report(step)


def _find_checkpoint(run: RunContext) -> Path | None:
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:
        return run.resume_path
    latest = run.checkpoint_dir / LATEST
    return run.checkpoint_dir / latest.read_text().strip() if latest.exists() else None


def _save(root: Path, step: int, state: dict[str, Any]) -> Path:
    import torch

    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    tmp_latest = root / (LATEST + ".tmp")
    tmp_latest.write_text(folder.name)
    os.replace(tmp_latest, root / LATEST)
    return folder


def noise_every_step(run: RunContext) -> None:
    train(run, EVERY_STEP)


def noise_every_third_step(run: RunContext) -> None:
    train(run, EVERY_THIRD_STEP)
