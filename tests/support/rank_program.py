"""A program run as a multi-rank command target (``python rank_program.py CHECKPOINT_DIR [--bug own-order]``):
stdlib only, one process per rank from the environment the harness sets (``RANK``, ``WORLD_SIZE``). Step s
of epoch e takes input ``((s - 1) * WORLD_SIZE + RANK) % 8`` (8 inputs an epoch). At a checkpoint each rank
writes its own file (atomically) and waits for the other ranks' (a file barrier) before publishing; a resume reads the
newest step every rank wrote. ``--bug own-order``: rank 1 counts its inputs from the resumed step only,
so after a resume it takes inputs again."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pytest_resume_check import client

N = 8


def main(out: Path, bug: str | None) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run = client.connect()
    steps = 2 * N // world
    done = {int(p.name.split("_")[1]) for p in out.glob("ckpt_*_rank0.json")}
    complete = [s for s in done if all((out / f"ckpt_{s}_rank{r}.json").exists() for r in range(world))]
    start = max(complete, default=0) if run.resume_mode == "auto" else 0
    if start:
        start = json.loads((out / f"ckpt_{start}_rank{rank}.json").read_text())["step"]
    run.resumed(start, out / f"ckpt_{start}_rank{rank}.json" if start else None)
    for step in range(start + 1, steps + 1):
        index = step - start - 1 if (bug == "own-order" and rank == 1) else step - 1
        global_index = index * world + rank
        run.consumed([global_index % N], step=step, epoch=global_index // N)
        run.step_end(step)
        if run.should_checkpoint(step):
            tmp = out / f"ckpt_{step}_rank{rank}.json.tmp"  # whole or absent: the barrier below sees a name
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, out / f"ckpt_{step}_rank{rank}.json")
            while not all((out / f"ckpt_{step}_rank{r}.json").exists() for r in range(world)):
                time.sleep(0.005)
            run.checkpoint_published(step, out / f"ckpt_{step}_rank{rank}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[3] if len(sys.argv) > 3 else None)
