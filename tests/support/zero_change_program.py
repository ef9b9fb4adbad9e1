"""A training program that knows nothing of resume-check (stdlib only, JSON checkpoints), run as a zero-change
command target: ``python zero_change_program.py OUT [--save atomic|in-place] [--pick number|name|none]
[--unsaved-momentum] [--from CHECKPOINT]``.

Its "model" is a weight updated from each step's input with momentum; every second step it saves a checkpoint
``step_<n>.json``; it resumes from the newest one it finds and writes ``model.json`` at the end. The flags are
planted bugs: ``in-place`` writes the checkpoint under its final name without fsync (a crash can leave it
torn), ``name`` picks the newest checkpoint by sorted name (``step_10`` before ``step_8``), ``none`` never
resumes, ``--unsaved-momentum`` leaves the momentum out of the checkpoint, so a resumed run delivers another
model.

Two more flags leave what the harness must not read: ``--leave fifo|socket`` puts a FIFO or a listening socket
beside its checkpoints (a progress pipe, a control socket), ``--deliver fifo|device|outside|link`` delivers
``model.json`` as a FIFO, a link to ``/dev/zero``, a link to a file outside its folder, or a relative link to
``final/model.json`` inside it (the one that is read).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket

STEPS = 12
EVERY = 2


def newest(out: str, pick: str) -> str | None:
    paths = glob.glob(os.path.join(out, "step_*.json"))
    if not paths or pick == "none":
        return None
    if pick == "name":
        return sorted(paths)[-1]
    return max(paths, key=lambda p: int(os.path.basename(p)[5:-5]))


def save(state: dict, path: str, how: str) -> None:
    if how == "in-place":
        with open(path, "w") as f:
            f.write(json.dumps(state))
        return
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(state))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--save", default="atomic")
    parser.add_argument("--pick", default="number")
    parser.add_argument("--unsaved-momentum", action="store_true")
    parser.add_argument("--from", dest="source", default="", help="the checkpoint to resume from (else the newest)")
    parser.add_argument("--leave", choices=("fifo", "socket"))
    parser.add_argument("--deliver", choices=("fifo", "device", "outside", "link"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    control = leave(args.out, args.leave)
    step, weight, momentum = 0, 1.0, 0.0
    found = args.source or newest(args.out, args.pick)
    if found is not None:
        with open(found) as f:
            state = json.load(f)
        step, weight, momentum = state["step"], state["weight"], state.get("momentum", 0.0)
        print(f"resumed from step {step}", flush=True)
    while step < STEPS:
        step += 1
        momentum = 0.9 * momentum + (step * 7 % 5 - 2) / 10
        weight = round(weight - 0.1 * momentum, 12)
        if step % EVERY == 0:
            state = {"step": step, "weight": weight}
            if not args.unsaved_momentum:
                state["momentum"] = momentum
            save(state, os.path.join(args.out, f"step_{step}.json"), args.save)
    deliver(args.out, {"weight": weight}, args.deliver)
    if control is not None:
        control.close()


def leave(out: str, what: str | None) -> socket.socket | None:
    """Put a FIFO or a listening socket (returned) beside the checkpoints, as a trainer's progress pipe or
    control socket; a resumed run finds the FIFO there."""
    if what == "fifo" and not os.path.exists(os.path.join(out, "progress.fifo")):
        os.mkfifo(os.path.join(out, "progress.fifo"))
    if what != "socket":
        return None
    here = os.getcwd()
    os.chdir(out)  # a short relative name: a socket's path has a small limit
    try:
        if os.path.exists("control.sock"):
            os.remove("control.sock")
        control = socket.socket(socket.AF_UNIX)
        control.bind("control.sock")
        control.listen()
    finally:
        os.chdir(here)
    return control


def deliver(out: str, model: dict, how: str | None) -> None:
    """Write ``model.json``, or what ``--deliver`` puts in its place."""
    path = os.path.join(out, "model.json")
    if os.path.lexists(path):
        os.remove(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "device":
        os.symlink("/dev/zero", path)
    elif how in ("outside", "link"):
        folder = os.path.join(out, "final") if how == "link" else os.path.dirname(os.path.abspath(out))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "model.json"), "w") as f:
            json.dump(model, f)
        os.symlink("final/model.json" if how == "link" else os.path.join(folder, "model.json"), path)
    else:
        with open(path, "w") as f:
            json.dump(model, f)


if __name__ == "__main__":
    main()
