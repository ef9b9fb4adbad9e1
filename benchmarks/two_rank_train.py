"""A two-rank training script that resume-check and ckpt-chaos 0.1.8 both run unchanged
(benchmarks/ranks_vs_ckpt_chaos.py).

    python two_rank_train.py --out DIR [--seed N] [--bug BUG]   (once per rank: RANK, WORLD_SIZE, MASTER_*)

gloo on CPU, a linear model whose gradients the ranks average, input ``(step - 1) * world + rank`` at each of
its 8 steps, a checkpoint every step through ``torch.distributed.checkpoint`` (``step_N/``: every rank's shard
and DCP's metadata, then rank 0's ``data.json``), published by rank 0's ``latest`` after a barrier, every file
written to a temporary name, fsynced and renamed. The resume prints ``resumed from step N`` (ckpt-chaos reads
it); rank 0 writes the trained model to ``model.pt`` at the end. It reports through
``pytest_resume_check.client``, which does nothing outside the harness. ``--bug`` plants one mistake:

- ``tracker_first``: ``latest`` names the new folder before DCP wrote any rank's shard;
- ``newest_folder``: the resume takes the newest ``step_N`` folder, whatever ``latest`` names;
- ``prune_early``: only the last checkpoint is kept, the old one deleted before ``latest`` names the new one;
- ``async_prune``: DCP's ``async_save``, ``latest`` naming the folder and the old one deleted before its future
  completed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from pytest_resume_check import client
from pytest_resume_check.integrations.durable import fsync_path

STEPS = 8
FEATURES = 4
BUGS = ("tracker_first", "newest_folder", "prune_early", "async_prune")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", choices=BUGS, default=None)
    args = parser.parse_args()
    out, bug = Path(args.out), args.bug
    out.mkdir(parents=True, exist_ok=True)
    run = client.connect()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    writes = dist.new_group(backend="gloo") if bug == "async_prune" else None
    start, source = 0, resume_source(out, bug)
    if source is not None:
        model_state, optim_state = get_state_dict(model, optimizer)  # the optimizer's state keys filled in
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(source))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(json.loads((source / "data.json").read_text())["step"])
    print(f"resumed from step {start}", flush=True)
    run.resumed(start, source)
    pending = None
    for step in range(start + 1, STEPS + 1):
        index = (step - 1) * world + rank
        run.consumed([index], step=step, epoch=0)
        x = torch.arange(FEATURES, dtype=torch.float32) * (index + 1) / 16
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        run.step_end(step)
        run.should_checkpoint(step)  # a checkpoint every step: this tells the harness the save starts
        pending = save(out, step, model, optimizer, rank, bug, writes, pending)
        run.checkpoint_published(step, out / f"step_{step}")
    if pending is not None:
        pending.result()
    if rank == 0:
        torch.save(model.state_dict(), out / "model.pt")
    dist.barrier()
    dist.destroy_process_group()


def save(out: Path, step: int, model, optimizer, rank: int, bug: str | None, writes, pending):
    folder = out / f"step_{step}"
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    if rank == 0 and bug == "tracker_first":
        durably(out / "latest", folder.name)
    if bug == "async_prune":
        if pending is not None:
            pending.result()
        pending = dcp.async_save(state, checkpoint_id=str(folder), process_group=writes)
    else:
        dcp.save(state, checkpoint_id=str(folder))
    if rank == 0:
        folder.mkdir(exist_ok=True)
        durably(folder / "data.json", json.dumps({"step": step}))
    dist.barrier()
    if rank == 0 and bug == "prune_early":
        prune(out, folder)
    if rank == 0 and bug != "tracker_first":
        durably(out / "latest", folder.name)
    if rank == 0 and bug == "async_prune":
        prune(out, folder)
    dist.barrier()
    return pending


def resume_source(out: Path, bug: str | None) -> Path | None:
    if bug == "newest_folder":
        folders = sorted(out.glob("step_*"), key=lambda p: int(p.name[5:]))
        return folders[-1] if folders else None
    latest = out / "latest"
    return out / latest.read_text().strip() if latest.exists() else None


def prune(out: Path, newest: Path) -> None:
    """Keep only ``newest``."""
    for old in out.glob("step_*"):
        if old != newest:
            shutil.rmtree(old)


def durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


if __name__ == "__main__":
    main()
