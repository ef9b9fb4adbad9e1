"""A program run as a multi-rank command target (``python rank_program.py CHECKPOINT_DIR [--bug own-order]
[--term-note]``): stdlib only, one process per rank from the environment the harness (or torchrun) sets
(``RANK``, ``WORLD_SIZE``). Each step the ranks take the next ``WORLD_SIZE`` inputs of a global count
(8 inputs an epoch, two epochs), rank r the r-th of them, so a resume at another world size (a node lost)
goes on with the inputs no rank took. The ranks meet at each step's end (a file barrier, which a rank
leaves with an error once a peer's process is gone, as a collective would); at a checkpoint each rank writes
its own file (atomically, with the world size that wrote it) and waits for the other ranks' before
publishing; a resume reads the newest step every rank of the world that saved it wrote (rank 0's file holds
the global count, so any world size goes on from it). ``--bug own-order``: rank 1 counts its inputs from
the resumed step only, so after a resume it takes inputs again. ``--term-note``: a SIGTERM appends ``rank
R`` to ``term.txt`` beside the checkpoints, the ranks do not watch their peers, and each waits at its end for
every rank to finish (so a rank whose peer died is still running when its launcher stops it)"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from pytest_resume_check import client

N = 8


def main(out: Path, flags: list[str]) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    bug = flags[flags.index("--bug") + 1] if "--bug" in flags else None
    if "--term-note" in flags:
        signal.signal(signal.SIGTERM, lambda signum, frame: note_term(out, rank))
    meet = Barrier(out, rank, world, watch_peers="--term-note" not in flags)
    run = client.connect()
    saved = {int(p.name.split("_")[1]): json.loads(p.read_text()) for p in out.glob("ckpt_*_rank0.json")}
    complete = [s for s, data in saved.items()
                if all((out / f"ckpt_{s}_rank{r}.json").exists() for r in range(data["world"]))]
    start = max(complete, default=0) if run.resume_mode == "auto" else 0
    taken = saved[start]["taken"] if start else 0
    run.resumed(start, out / f"ckpt_{start}_rank0.json" if start else None)
    for step in range(start + 1, start + (2 * N - taken) // world + 1):
        index = (step - start - 1) * world + rank
        global_index = index if (bug == "own-order" and rank == 1) else taken + index
        run.consumed([global_index % N], step=step, epoch=global_index // N)
        run.step_end(step)
        meet.wait(f"step{step}")
        if run.should_checkpoint(step):
            tmp = out / f"ckpt_{step}_rank{rank}.json.tmp"  # whole or absent: the barrier below sees a name
            tmp.write_text(json.dumps({"step": step, "taken": taken + (step - start) * world, "world": world}))
            os.replace(tmp, out / f"ckpt_{step}_rank{rank}.json")
            meet.wait(f"ckpt{step}")
            run.checkpoint_published(step, out / f"ckpt_{step}_rank{rank}.json")
    if "--term-note" in flags:
        meet.wait("finished")


class Barrier:
    """The ranks of one round meet by files in the checkpoint folder; each rank's pid is in a file of its own.
    A round is one run, or one attempt of a torchrun job: the harness's token of the run (a killed run and its
    resume share the folder) and the attempt name it, the restart count where no attempt is given (a node that
    rejoins restarts the workers without counting a restart). Unless ``watch_peers`` is off, a rank whose
    peer's process is gone leaves with an error."""

    def __init__(self, out: Path, rank: int, world: int, watch_peers: bool):
        run = os.environ.get("PYTEST_RESUME_CHECK_RUN") or os.environ.get("MASTER_PORT")
        attempt = os.environ.get("PYTEST_RESUME_CHECK_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)
        self.round = f"{run}.{attempt}"
        self.out, self.rank, self.world, self.watch_peers = out, rank, world, watch_peers
        tmp = out / f"pid.{self.round}.{rank}.tmp"  # whole or absent: a peer reads it while this rank starts
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, out / f"pid.{self.round}.{rank}")

    def wait(self, name: str) -> None:
        (self.out / f"at.{self.round}.{name}.{self.rank}").touch()
        for peer in range(self.world):
            while not (self.out / f"at.{self.round}.{name}.{peer}").exists():
                pid = self.out / f"pid.{self.round}.{peer}"
                if self.watch_peers and pid.exists() and not alive(int(pid.read_text())):
                    sys.exit(f"rank {peer} is gone")
                time.sleep(0.005)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def note_term(out: Path, rank: int) -> None:
    with open(out / "term.txt", "a") as f:
        f.write(f"rank {rank}\n")
    os._exit(143)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
