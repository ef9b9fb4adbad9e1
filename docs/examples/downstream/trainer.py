"""A small PyTorch regression trainer that resumes exactly after a SIGKILL.

This is the downstream example of pytest-resume-check: an ordinary training loop with its own
checkpoints, plus the few report calls the harness needs. Three choices make the resume exact, and
``pytest --resume-matrix`` checks each of them:

* The data order is a pure function of (seed, epoch): ``StatefulDistributedSampler`` + ``set_epoch``.
  The loader state then only has to carry the position inside the epoch. (``shuffle=True`` with a
  ``torch.Generator`` does not work: resumed mid-epoch, torchdata 0.11 draws a different permutation
  for the *next* epoch than the uninterrupted run does.)
* A checkpoint holds everything the next input depends on: loader state, epoch and step, besides the
  model, the optimizer and torch's generator.
* A checkpoint appears atomically (temporary file, fsync, rename), so a kill during a save leaves
  the previous checkpoint selected instead of a torn file.

It reports its training state (``run.state``) right after restoring and after every step, and what it
delivers at the end (``run.final``), so a resume that forgets part of the state fails too.

Case keys: ``n`` inputs, ``batch`` size, ``epochs``, ``shuffle``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from pytest_resume_check import RunContext, WithIds, ids_of
from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH

DEFAULTS = {"n": 10, "batch": 4, "epochs": 2, "shuffle": False}
STATE_FILE = "state.pt"


def total_steps(case: Mapping[str, Any]) -> int:
    """Steps of an uninterrupted run (the last batch of an epoch may be short: drop_last=False)."""
    c = {**DEFAULTS, **case}
    return math.ceil(c["n"] / c["batch"]) * c["epochs"]


def epoch_boundaries(case: Mapping[str, Any]) -> list[int]:
    """The steps that take an epoch's last batch."""
    c = {**DEFAULTS, **case}
    per_epoch = math.ceil(c["n"] / c["batch"])
    return [per_epoch * e for e in range(1, c["epochs"] + 1)]


def make_loader(case: Mapping[str, Any], seed: int) -> tuple[StatefulDistributedSampler, StatefulDataLoader]:
    # Fixed data: y = x @ w + noise. WithIds adds each row's index as "input_id" to the dict item.
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(case["n"], 3, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.01 * torch.randn(case["n"], generator=g)
    dataset = WithIds([{"x": x[i], "y": y[i]} for i in range(case["n"])])
    sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=case["shuffle"], seed=seed)
    return sampler, StatefulDataLoader(dataset, batch_size=case["batch"], sampler=sampler)


def checkpoint_to_resume(run: RunContext) -> Path | None:
    """The checkpoint folder the run's resume mode selects, or None to start fresh."""
    if run.resume_mode == RESUME_DISABLED:
        return None
    if run.resume_mode == RESUME_PATH:  # an explicit folder, possibly in another output directory
        if run.resume_path is None or not (run.resume_path / STATE_FILE).is_file():
            raise FileNotFoundError(f"resume path {run.resume_path} holds no {STATE_FILE}")
        return run.resume_path
    # auto: the newest complete checkpoint. A folder without state.pt is a save that was killed.
    done = [p for p in run.checkpoint_dir.glob("step_*") if (p / STATE_FILE).is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)


def save(root: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``root/step_N/state.pt`` so that it exists complete or not at all."""
    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    with open(tmp, "wb") as f:  # a file object, because torch.save(obj, path) never fsyncs
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return folder


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, Any]) -> None:
    loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train(run: RunContext) -> None:
    """The training job. The harness runs it in a child process and may SIGKILL it at any report call."""
    case = {**DEFAULTS, **run.case}
    torch.manual_seed(run.seed)
    sampler, loader = make_loader(case, run.seed)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, epoch, rng = 0, 0, None

    def components() -> dict[str, Any]:
        """The state that decides the rest of the run, by component (compared with the reference's)."""
        return {"model": model, "optimizer": optimizer, "rng": torch.get_rng_state(),
                "data": {"loader": loader, "epoch": epoch}}

    folder = checkpoint_to_resume(run)
    if folder is not None:
        state = torch.load(folder / STATE_FILE, weights_only=True)  # plain tensors and numbers only
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # lazy: takes effect at the next iter(loader)
        step, epoch, rng = state["step"], state["epoch"], state["rng"]
    run.resumed(step, folder)  # required once, before consuming: the harness cuts the killed run here
    if folder is not None:
        run.state(step, components())  # what the checkpoint restored

    while epoch < case["epochs"]:
        # The sampler's state holds only its position, not the epoch: set the epoch before iter().
        sampler.set_epoch(epoch)
        batches = iter(loader)  # draws the iterator's base seed from torch's generator
        if rng is not None:  # so restore the generator after that draw, as it was after the saved step
            torch.set_rng_state(rng)
            rng = None
        for batch in batches:
            step += 1
            run.consumed(ids_of(batch), step=step, epoch=epoch)
            train_step(model, optimizer, batch)
            run.step_end(step)
            if run.should_checkpoint(step):
                path = save(run.checkpoint_dir, step, {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),  # the position inside this epoch
                    "epoch": epoch,
                    "step": step,
                    "rng": torch.get_rng_state(),
                })
                run.checkpoint_published(step, path)
            run.state(step, components())
        epoch += 1
    run.final({"model": model})  # what the job delivers


def warm_up() -> None:
    """Run once in the harness's fork server (``preload`` in conftest.py): the first optimizer step
    and the first torch.save are slow, so pay for them once instead of in every forked run."""
    import io

    case = {**DEFAULTS, "n": 4, "batch": 2}
    _, loader = make_loader(case, seed=0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        train_step(model, optimizer, batch)
    torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, io.BytesIO())
