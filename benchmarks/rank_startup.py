"""Start-up cost of a run of the bundled DDP loop on 1 and 2 ranks, forked from the preloaded server and
spawned. Prints figures; asserts nothing.

    python benchmarks/rank_startup.py [--reps 7]

Each variant is one supervised run through the engine's runner, interleaved in every repetition (order
rotated): the run starts, its launcher forks the ranks, the ranks meet over gloo on a loopback port,
build DDP and report their first step. ``first event`` is the time from starting the run to its first
event (the launcher's rank list on 2 ranks, ``resumed`` on 1); ``first step`` the time to the first
``step_end`` as the harness records it (rendezvous and DDP construction included); ``whole run`` the
uninterrupted 12-step (2 ranks) or 24-step (1 rank) run with one checkpoint. Figures are medians over
the repetitions; the ratio is the median of per-repetition ratios to ``1 rank, forkserver``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from pytest_resume_check.builtin import ddp
from pytest_resume_check.builtin.targets import ddp_loop
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    variants = {f"{w} rank{'s' if w > 1 else ''}, {iso}": (w, iso) for iso in ("forkserver", "spawn") for w in (1, 2)}
    root = Path(tempfile.mkdtemp(prefix="rank-startup-"))
    runner = Runner(seed=1, hang_timeout=120)
    figures: dict[str, dict[str, list[float]]] = {name: {"first event": [], "first step": [], "whole run": []}
                                                  for name in variants}
    names = list(variants)
    for rep in range(args.reps + 1):  # repetition 0 warms the fork server up and is not counted
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            world, isolation = variants[name]
            # A one-rank target gets its group of one only when declared distributed (an elastic size).
            target = ddp_loop.with_options(world_size=world, isolation=isolation, elastic=(3 - world,),
                                           steps=lambda case, w=world: ddp.total_steps(w))
            workdir = Layout(root).fresh(root / f"{world}-{isolation}-{rep}")
            plan = runner.plan(target, target.cases[0], workdir, 0, checkpoint_steps=(4,))
            record = runner.run(plan, target)
            if record.outcome != "done":
                sys.exit(f"{name}: the run ended {record.outcome}: {record.describe()}; see {plan.log_path}")
            if rep:
                figures[name]["first event"].append(record.first_event_seconds or 0.0)
                figures[name]["first step"].append(record.first_step_seconds or float("nan"))
                figures[name]["whole run"].append(record.seconds)
    print(f"per run of the DDP loop, median of {args.reps} (python {sys.version.split()[0]}):")
    base = figures[names[0]]["whole run"]
    print(f"  {'variant':22s} {'first event':>12s} {'first step':>11s} {'whole run':>10s}  ratio (whole run)")
    for name in names:
        f = figures[name]
        ratio = statistics.median(v / b for v, b in zip(f["whole run"], base))
        print(f"  {name:22s} {statistics.median(f['first event']) * 1000:9.0f} ms "
              f"{statistics.median(f['first step']) * 1000:8.0f} ms {statistics.median(f['whole run']) * 1000:7.0f} ms"
              f"  {ratio:5.2f}x")


if __name__ == "__main__":
    main()
