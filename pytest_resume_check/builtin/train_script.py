"""A training script as people write them, run by the harness as a command target (``script_example``).

Plain Python, no torch: a linear model fitted by SGD with momentum over a synthetic data set that is
reshuffled each epoch, JSON checkpoints written atomically (temporary file, fsync, rename) and the
last two kept. It resumes from its newest checkpoint (``--resume auto``) or a given one (``--resume
path --resume-from FILE``) and goes on at the exact batch it stopped at. The only lines that concern
the harness are the ``run.*`` calls: without the harness ``client.connect()`` returns a context whose
calls do nothing, and ``python -m pytest_resume_check.builtin.train_script --out DIR`` trains as usual.

``--plant loader`` (the resumed run starts its epoch over) and ``--plant optimizer`` (the momentum is
not restored) are the planted bugs of the harness's own tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path
from typing import Any

from pytest_resume_check import client

INPUTS, FEATURES, BATCH, KEEP = 24, 3, 4, 2


def data(seed: int) -> list[tuple[int, list[float], float]]:
    """(id, features, target) of every input; the target is a fixed linear function plus noise."""
    rng = random.Random(seed)
    rows = []
    for i in range(INPUTS):
        x = [rng.uniform(-1, 1) for _ in range(FEATURES)]
        rows.append((i, x, 0.5 * x[0] - 2.0 * x[1] + x[2] + rng.gauss(0, 0.1)))
    return rows


def order(seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The input order of ``epoch``: a fresh permutation per epoch, derived from the seed and the epoch."""
    ids = list(range(INPUTS))
    if shuffle:
        random.Random(seed * 1000 + epoch).shuffle(ids)
    return ids


def save(folder: Path, state: dict) -> Path:
    """Write ``step_N.json`` atomically and durably, then drop all but the newest ``KEEP``."""
    path = folder / f"step_{state['step']}.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in checkpoints(folder)[:-KEEP]:
        old.unlink()
    return path


def checkpoints(folder: Path) -> list[Path]:
    """This script's checkpoints in ``folder``, oldest first."""
    return sorted(folder.glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))


def main(argv: list[str] | None = None, run: Any = None) -> None:
    """Train; ``run`` is the client's context (connected under the harness) or, to run the same script
    inside a forked Python target, that target's ``RunContext`` (the calls are the same)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--resume", choices=("auto", "path", "disabled"), default="auto")
    p.add_argument("--resume-from", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shuffle", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps (0: never)")
    p.add_argument("--plant", choices=("", "loader", "optimizer"), default="")
    args = p.parse_args(argv)
    run = run if run is not None else client.connect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = data(args.seed)
    steps_per_epoch = -(-INPUTS // BATCH)

    state: dict[str, Any] = {"step": 0, "epoch": 0, "position": 0,
                             "weights": [0.0] * FEATURES, "momentum": [0.0] * FEATURES}
    source = Path(args.resume_from) if args.resume == "path" else next(reversed(checkpoints(out)), None)
    if args.resume != "disabled" and source is not None:
        restored = json.loads(Path(source).read_text())
        if args.plant == "loader":
            restored["position"] = 0
        if args.plant == "optimizer":
            restored["momentum"] = [0.0] * FEATURES
        state = restored
    run.resumed(state["step"], source if state["step"] else None)

    lr, beta = 0.1, 0.9
    while state["epoch"] < args.epochs:
        ids = order(args.seed, state["epoch"], bool(args.shuffle))
        while state["position"] < INPUTS:
            batch = ids[state["position"]:state["position"] + BATCH]
            step = state["step"] + 1
            run.consumed(batch, step=step, epoch=state["epoch"])
            grad = [0.0] * FEATURES
            for i in batch:
                _, x, y = rows[i]
                err = sum(w * v for w, v in zip(state["weights"], x)) - y
                grad = [g + 2 * err * v / len(batch) for g, v in zip(grad, x)]
            state["momentum"] = [beta * m + g for m, g in zip(state["momentum"], grad)]
            state["weights"] = [w - lr * m for w, m in zip(state["weights"], state["momentum"])]
            state["step"], state["position"] = step, state["position"] + len(batch)
            if state["position"] >= INPUTS:
                state["epoch"], state["position"] = state["epoch"] + 1, 0
            run.step_end(step)
            if run.should_checkpoint(step) or (args.save_every and step % args.save_every == 0):
                run.checkpoint_published(step, save(out, state))
            run.state(step, {"weights": state["weights"], "momentum": state["momentum"],
                             "position": [state["epoch"], state["position"]]})
            if state["position"] == 0:
                break
    print(f"trained {state['step']} steps ({steps_per_epoch} per epoch), weights {state['weights']}")


if __name__ == "__main__":
    main()
