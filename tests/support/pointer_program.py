"""A training program that commits each checkpoint through a pointer file, as DeepSpeed (``latest``), Megatron-LM
(its tracker) and verl (``latest_checkpointed_iteration.txt``) do, and knows nothing of resume-check (stdlib only,
JSON checkpoints): ``python pointer_program.py OUT [--order checkpoint-first|pointer-first] [--names
name|path|number] [--folders] [--unsaved-scheduler] [--start-over] [--no-pointer] [--no-model-on-resume]``.

Its "model" is a weight updated from each step's input with momentum at a learning rate that a step scheduler
halves every third step. Every second step it writes checkpoint ``ckpt_<n>.json`` (temporary file, fsync, rename;
with ``--folders``: a folder ``ckpt_<n>/`` filled in place, as verl fills ``global_step_<n>/``), then the pointer
``latest.txt`` naming it (written the same way; with ``--folders`` in place, as verl writes its tracker, but
fsynced). It resumes
from the checkpoint the pointer names and writes ``model.json`` at the end.

``--names``: what the pointer holds: the checkpoint's file name (DeepSpeed's tag), its absolute path, or the
step number (Megatron's and verl's trackers). The planted bugs: ``pointer-first`` writes
the pointer before the checkpoint it names (a crash between the two leaves a pointer to nothing),
``--unsaved-scheduler`` leaves the scheduler out of the checkpoint, ``--start-over`` reads the pointer and then
trains from scratch anyway, ``--no-model-on-resume`` delivers no model from a resumed run. ``--no-pointer`` writes no
pointer and resumes from the checkpoint with the highest number (with ``--folders``: folders filled in place that
never get a final name).
"""

from __future__ import annotations

import argparse
import json
import os

STEPS = 12
EVERY = 2
POINTER = "latest.txt"


def write(path: str, text: str, in_place: bool = False) -> None:
    """``text`` into ``path``, fsynced: through a temporary file renamed into place, or ``in_place`` (as verl
    writes its tracker and the files of its checkpoint folders, here durably)."""
    with open(path if in_place else path + ".tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if not in_place:
        os.replace(path + ".tmp", path)


def checkpoint_path(out: str, step: int, folders: bool) -> str:
    """Where the state of ``step`` lives (inside its folder with ``--folders``)."""
    return os.path.join(out, f"ckpt_{step}", "state.json") if folders else os.path.join(out, f"ckpt_{step}.json")


def save_checkpoint(out: str, step: int, state: dict, folders: bool) -> None:
    """The checkpoint of ``step``: a file renamed into place, or a folder filled in place."""
    if folders:
        os.makedirs(os.path.join(out, f"ckpt_{step}"), exist_ok=True)
    write(checkpoint_path(out, step, folders), json.dumps(state), in_place=folders)


def newest(out: str) -> str | None:
    """The step number of the newest checkpoint in ``out`` (None: there is none)."""
    steps = [int(n[len("ckpt_"):].split(".")[0]) for n in os.listdir(out) if n.startswith("ckpt_") and ".tmp" not in n]
    return str(max(steps)) if steps else None


def pointed(out: str, text: str, folders: bool) -> str:
    """The state file the pointer's ``text`` names."""
    if text.isdigit():
        return checkpoint_path(out, int(text), folders)
    path = text if os.path.isabs(text) else os.path.join(out, os.path.basename(text))
    return os.path.join(path, "state.json") if folders else path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--order", choices=["checkpoint-first", "pointer-first"], default="checkpoint-first")
    parser.add_argument("--names", choices=["name", "path", "number"], default="name")
    parser.add_argument("--folders", action="store_true")
    parser.add_argument("--unsaved-scheduler", action="store_true")
    parser.add_argument("--start-over", action="store_true")
    parser.add_argument("--no-pointer", action="store_true")
    parser.add_argument("--no-model-on-resume", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    step, weight, momentum, decays = 0, 1.0, 0.0, 0
    pointer = os.path.join(args.out, POINTER)
    text = newest(args.out) if args.no_pointer else None
    if os.path.exists(pointer):
        with open(pointer) as f:
            text = f.read().strip()
    resumed = text is not None and not args.start_over
    if resumed:
        with open(pointed(args.out, str(text), args.folders)) as f:
            state = json.load(f)
        step, weight, momentum = state["step"], state["weight"], state["momentum"]
        decays = state.get("scheduler", 0)
        print(f"resumed from step {step}", flush=True)
    while step < STEPS:
        step += 1
        lr = 0.1 * 0.5 ** decays
        momentum = 0.9 * momentum + (step * 7 % 5 - 2) / 10
        weight = round(weight - lr * momentum, 12)
        decays += step % 3 == 0  # the scheduler's step
        if step % EVERY:
            continue
        state = {"step": step, "weight": weight, "momentum": momentum}
        if not args.unsaved_scheduler:
            state["scheduler"] = decays
        name = f"ckpt_{step}" if args.folders else f"ckpt_{step}.json"
        text = {"name": name, "path": os.path.join(args.out, name), "number": str(step)}[args.names]
        if args.order == "pointer-first" and not args.no_pointer:
            write(pointer, text, in_place=args.folders)
        save_checkpoint(args.out, step, state, args.folders)
        if args.order == "checkpoint-first" and not args.no_pointer:
            write(pointer, text, in_place=args.folders)
    if args.no_model_on_resume and resumed:
        return
    with open(os.path.join(args.out, "model.json"), "w") as f:
        json.dump({"weight": weight}, f)


if __name__ == "__main__":
    main()
