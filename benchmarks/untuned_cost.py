"""What a target costs when it is declared the obvious way, without tuning. Prints
figures; asserts nothing.

    python benchmarks/untuned_cost.py [--repeat 1] [--ddp] [--out /tmp/untuned-cost]

One project, one conftest.py holding a plain PyTorch loop (torch imported at the top, a linear model,
Adam, ``torch.save`` checkpoints) declared as four targets with one matrix, each run as a pytest session
of its own (serial, so its terminal summary has the runs' timings) in one invocation, side by side:

- ``untuned``: no ``preload``, nothing else: the obvious declaration (``auto_preload`` on, the default);
- ``untuned_before``: the same with ``auto_preload=False``: what it cost before ``auto_preload`` existed;
- ``tuned``: ``preload=("torch", "conftest:warm_up")`` by hand, ``auto_preload=False``: the tuned one as
  it was;
- ``tuned_auto``: the same hand-tuned preload, ``auto_preload`` on.

``--ddp`` adds the same comparison for a two-rank DDP loop (gloo), declared with ``preload=("torch",)``
and no warm-up (what the issue measured: 3.2x slower without ``torch._dynamo`` preloaded): with and
without ``auto_preload``, and with the warm-up by hand. ``--repeat N`` runs the sessions N times,
interleaved, and prints the median; ``--skip-before`` leaves the slow ``*_before`` sessions out of the
repetitions after the first.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFTEST = '''
"""A plain PyTorch loop with its own checkpoints, declared as resume-check targets."""

import math
import os

import torch

from pytest_resume_check import resume_target

N, BATCH, EPOCHS = 12, 4, 2
PER_EPOCH = math.ceil(N / BATCH)
STEPS = PER_EPOCH * EPOCHS


def train(run):
    torch.manual_seed(run.seed)
    data = torch.randn(N, 8, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start, path = 0, None
    if run.resume_mode == "path":
        path = run.resume_path
    elif run.resume_mode == "auto" and (run.checkpoint_dir / "latest").exists():
        path = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if path is not None:
        state = torch.load(path / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    run.resumed(start, path)
    for step in range(start + 1, STEPS + 1):
        epoch, index = divmod(step - 1, PER_EPOCH)
        order = torch.randperm(N, generator=torch.Generator().manual_seed(run.seed + epoch))
        ids = order[index * BATCH:(index + 1) * BATCH]
        run.consumed(ids.tolist(), step=step, epoch=epoch)
        loss = model(data[ids]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.step_end(step)
        if run.should_checkpoint(step):
            folder = run.checkpoint_dir / f"step_{step}"
            folder.mkdir(exist_ok=True)
            with open(folder / "state.tmp", "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(folder / "state.tmp", folder / "state.pt")
            (run.checkpoint_dir / "latest.tmp").write_text(folder.name)
            os.replace(run.checkpoint_dir / "latest.tmp", run.checkpoint_dir / "latest")
            run.checkpoint_published(step, folder)


def warm_up():
    """The hand-tuned warm-up: a step and a save, once, in the fork server."""
    import io

    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, io.BytesIO())


CASES = [{"id": "a"}, {"id": "b"}]
COMMON = dict(steps=STEPS, cases=CASES, boundaries=lambda case: [PER_EPOCH * e for e in range(1, EPOCHS + 1)],
              crash_save=False)
untuned = resume_target(train, name="untuned", **COMMON)
untuned_before = resume_target(train, name="untuned_before", auto_preload=False, **COMMON)
tuned = resume_target(train, name="tuned", preload=("torch", "conftest:warm_up"), auto_preload=False, **COMMON)
tuned_auto = resume_target(train, name="tuned_auto", preload=("torch", "conftest:warm_up"), **COMMON)
'''

DDP = '''

from pytest_resume_check.builtin import ddp as _ddp

DDP_COMMON = dict(steps=_ddp.total_steps(2), boundaries=lambda case: _ddp.epoch_boundaries(2),
                  cases=({"id": "shuffle", "shuffle": True},), world_size=2, crash_save=False)
ddp_untuned = resume_target(_ddp.correct_ddp, name="ddp_untuned", preload=("torch",), **DDP_COMMON)
ddp_before = resume_target(_ddp.correct_ddp, name="ddp_before", preload=("torch",), auto_preload=False,
                           **DDP_COMMON)
ddp_tuned = resume_target(_ddp.correct_ddp, name="ddp_tuned", auto_preload=False,
                          preload=("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.ddp:warm_up"),
                          **DDP_COMMON)
'''

LOOP_VARIANTS = ("untuned", "untuned_before", "tuned", "tuned_auto")
DDP_VARIANTS = ("ddp_untuned", "ddp_before", "ddp_tuned")


def session(project: Path, target: str) -> dict[str, object]:
    """One serial pytest session of ``target``'s quick matrix: wall seconds, cells, the time note."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--resume-matrix",
               f"--resume-matrix-target={target}", "--resume-matrix-seed=0", "-m", "resume_matrix"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    passed = re.search(r"(\d+) passed", done.stdout)
    failed = re.search(r"(\d+) failed", done.stdout)
    note = next((ln for ln in done.stdout.splitlines() if "before their first step" in ln), "")
    return {"wall": wall, "passed": int(passed.group(1)) if passed else 0,
            "failed": int(failed.group(1)) if failed else 0, "note": note}


def table(title: str, variants: tuple[str, ...], runs: dict[str, list[dict[str, object]]], base: str) -> None:
    print(f"\n{title}")
    print(f"{'target':<16} {'cells':>5} {'wall s (median)':>16} {'vs ' + base:>16}  walls")
    reference = statistics.median(float(r["wall"]) for r in runs[base])  # type: ignore[arg-type]
    for name in variants:
        walls = [float(r["wall"]) for r in runs[name]]  # type: ignore[arg-type]
        cells = runs[name][0]["passed"]
        failed = runs[name][0]["failed"]
        median = statistics.median(walls)
        extra = f" ({failed} failed)" if failed else ""
        print(f"{name:<16} {cells!s:>5} {median:>16.1f} {median / reference:>15.2f}x  "
              f"{', '.join(f'{w:.1f}' for w in walls)}{extra}")
    for name in variants:
        notes = {str(r["note"]) for r in runs[name] if r["note"]}
        for note in notes:
            print(f"  {name}: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--ddp", action="store_true", help="also the two-rank DDP loop (a few minutes more)")
    parser.add_argument("--skip-before", action="store_true", help="run the *_before sessions once only")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    project = args.out or Path(tempfile.mkdtemp(prefix="untuned-cost-"))
    project.mkdir(parents=True, exist_ok=True)
    (project / "conftest.py").write_text(CONFTEST + (DDP if args.ddp else ""))
    (project / "pytest.ini").write_text("[pytest]\n")
    variants = LOOP_VARIANTS + (DDP_VARIANTS if args.ddp else ())
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in variants}
    print(f"project {project}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for repetition in range(args.repeat):
        for name in variants:  # interleaved: a load change hits every variant alike
            if repetition and args.skip_before and name.endswith("_before"):
                continue
            runs[name].append(session(project, name))
    table("plain torch loop, quick matrix, serial", LOOP_VARIANTS, runs, "tuned")
    if args.ddp:
        table("two-rank DDP loop (gloo), quick matrix, serial", DDP_VARIANTS, runs, "ddp_tuned")
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
