"""A small real two-rank DDP trainer whose ranks each draw dropout masks from their own torch RNG, for
the state-on-every-rank tests (tests/engine/test_state_every_rank.py).

``torch.distributed`` with gloo on CPU (the harness launches the ranks), a ``Linear -> Dropout ->
Linear`` model under ``DistributedDataParallel`` and SGD with momentum. The initial weights come from
``torch.manual_seed(run.seed)`` (the same on every rank); then each rank seeds its generator with
``run.seed + rank``, so rank 1's dropout masks differ from rank 0's and each rank's RNG is part of the
job's state. Dropout draws from the process's global torch generator, the one the harness also captures
at every step end; no ``DataLoader`` starts an iterator (which would draw a base seed from it), so
restoring it anywhere before the next step is right.

Input i has features that depend on i only; an epoch is ``N_INPUTS`` inputs, and each step every rank
takes one: rank r the input ``taken + r``, where ``taken`` counts the inputs of the epoch all ranks took
together (so a resume at another world size continues with the inputs no rank took). On two ranks: 4
steps, epochs end at steps 2 and 4 (small, so the full matrix of a two-rank job stays cheap).

The checkpoint of step N is the folder ``step_N``: ``model.pt`` (model and optimizer, replicated: from
rank 0), ``data.json`` (step, epoch, taken, world size, from rank 0), one ``rng_rank<r>.pt`` per rank,
then - after a barrier - ``latest`` names the folder. Every rank reports its state after every step and
right after restoring (``run.state(step, {"model", "optimizer", "rng"})``).

Planted bug ``rank0_rng``: only rank 0 saves its RNG, and on resume every rank loads it, so rank 1
continues with rank 0's generator (``STATE_DIVERGED ... on rank 1 ...: rng differs`` at the restored step).

``numpy_noise`` adds noise from numpy's global generator (seeded ``seed + rank``) to each rank's input, and
each rank saves and restores that generator too (``numpy_rank<r>.json``); it reports it nowhere, so only the
harness's capture sees it. Planted bug ``rank1_numpy``: rank 1 does not restore it. Its other noise changes
its gradients, and the all-reduce spreads them to rank 0's model at the first step after the resume: the
cause is rank 1's generator, captured as that step takes its first inputs.
torch is imported inside the functions: loading this module costs nothing.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

N_INPUTS = 4
EPOCHS = 2
FEATURES = 4
HIDDEN = 8
WORLD_SIZE = 2
LATEST = "latest"
MODEL_FILE = "model.pt"
DATA_FILE = "data.json"
#: Preloaded in the fork server: torch, torch.distributed and DDP, and torch._dynamo, which DDP imports when first
#: built (without torchdata, which the bundled DDP loop's warm-up needs).
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel")

RANK0_RNG = "rank0_rng"
NUMPY_NOISE = "numpy_noise"
RANK1_NUMPY = "rank1_numpy"


def total_steps(case: Any = None) -> int:
    """Steps of an uninterrupted run (on ``WORLD_SIZE`` ranks)."""
    return EPOCHS * N_INPUTS // WORLD_SIZE


def epoch_boundaries(case: Any = None) -> list[int]:
    """The steps that end an epoch (on ``WORLD_SIZE`` ranks)."""
    per_epoch = N_INPUTS // WORLD_SIZE
    return [per_epoch * (e + 1) for e in range(EPOCHS)]


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def numpy_file(rank: int) -> str:
    return f"numpy_rank{rank}.json"


def features(index: int) -> Any:
    import torch

    return (torch.arange(FEATURES, dtype=torch.float32) + 1) * (index + 1) / (N_INPUTS * FEATURES)


def train(run: Any, bug: str | None = None) -> None:
    """The job on this rank (the harness starts one process per rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size, timeout=timedelta(seconds=60))
    try:
        # The model lives in _loop's frame: freed when it returns, before the group is destroyed. Freed
        # after (the DDP module a local of this frame), a rank sometimes hung at its exit.
        _loop(run, bug)
    finally:
        dist.destroy_process_group()


def _loop(run: Any, bug: str | None) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    rank, world = run.rank, run.world_size
    torch.manual_seed(run.seed)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Dropout(0.5),
                              torch.nn.Linear(HIDDEN, 1))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(run.seed + rank)  # each rank's own dropout masks
    noisy = bug in (NUMPY_NOISE, RANK1_NUMPY)
    if noisy:
        import numpy as np

        np.random.seed(run.seed + rank)
    step, epoch, taken = 0, 0, 0
    folder = _resume_source(run)
    if folder is not None:
        saved = torch.load(folder / MODEL_FILE, weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data = json.loads((folder / DATA_FILE).read_text())
        step, epoch, taken = int(data["step"]), int(data["epoch"]), int(data["taken"])
        own = 0 if bug == RANK0_RNG else rank
        torch.set_rng_state(torch.load(folder / rng_file(own), weights_only=True))
        if noisy and not (bug == RANK1_NUMPY and rank == 1):
            kind, keys, pos, has_gauss, gauss = json.loads((folder / numpy_file(rank)).read_text())
            np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    run.resumed(step, folder)

    def report(at: int) -> None:
        run.state(at, {"model": net, "optimizer": optimizer, "rng": torch.get_rng_state()})

    if folder is not None:
        report(step)  # what this rank restored
    while epoch < EPOCHS:
        while taken < N_INPUTS:
            index = taken + rank
            step += 1
            run.consumed([index], step=step, epoch=epoch)
            x = features(index)
            if noisy:
                x = x + torch.from_numpy(np.random.normal(0.0, 0.1, FEATURES).astype("float32"))
            loss = model(x.unsqueeze(0)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            taken += world
            run.step_end(step)
            if run.should_checkpoint(step):
                _save(run, step, epoch, taken, net, optimizer, bug)
            report(step)
        epoch, taken = epoch + 1, 0


def _resume_source(run: Any) -> Path | None:
    if run.resume_mode == "disabled":
        return None
    if run.resume_mode == "path":
        return run.resume_path
    latest = run.checkpoint_dir / LATEST
    return run.checkpoint_dir / latest.read_text().strip() if latest.exists() else None


def _save(run: Any, step: int, epoch: int, taken: int, net: Any, optimizer: Any, bug: str | None) -> None:
    import io

    import torch
    import torch.distributed as dist

    folder = run.checkpoint_dir / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    if bug != RANK0_RNG or run.rank == 0:
        _write(folder / rng_file(run.rank), _torch_bytes(torch.get_rng_state()))
    if bug in (NUMPY_NOISE, RANK1_NUMPY):
        import numpy as np

        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        _write(folder / numpy_file(run.rank), json.dumps([kind, keys.tolist(), pos, has_gauss, gauss]).encode())
    if run.rank == 0:
        buffer = io.BytesIO()
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
        _write(folder / MODEL_FILE, buffer.getvalue())
        data = {"step": step, "epoch": epoch, "taken": taken, "world_size": run.world_size}
        _write(folder / DATA_FILE, json.dumps(data).encode())
    dist.barrier()
    if run.rank == 0:
        _write(run.checkpoint_dir / LATEST, folder.name.encode())
    dist.barrier()
    run.checkpoint_published(step, folder)


def _torch_bytes(value: Any) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Write to a temporary name, fsync, rename over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def correct(run: Any) -> None:
    """Every rank saves and restores its own RNG."""
    train(run)


def rank0_rng(run: Any) -> None:
    """Only rank 0's RNG is saved; every rank restores it on resume."""
    train(run, RANK0_RNG)


def numpy_noise(run: Any) -> None:
    """Every rank draws input noise from numpy's global generator, and saves and restores it."""
    train(run, NUMPY_NOISE)


def rank1_numpy(run: Any) -> None:
    """As numpy_noise, but rank 1 does not restore its numpy generator."""
    train(run, RANK1_NUMPY)
