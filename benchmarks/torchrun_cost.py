"""Cost of a run of the bundled two-rank DDP loop launched by torchrun against the harness's own launcher,
side by side, and of a run in which torchrun restarts its workers once. Prints figures; asserts
nothing.

    python benchmarks/torchrun_cost.py [--reps 5]

Each variant is one supervised run through the engine's runner, interleaved in every repetition (order
rotated), all forked from the one preloaded server:

- ``harness launcher``: the run's process forks a process per rank (``ddp_loop``);
- ``torchrun``: the run's process is torchrun's agent (c10d rendezvous on loopback, workers forked from it,
  ``ddp_torchrun``);
- ``torchrun, 1 restart``: the same, with rank 1 killed alone right after the checkpoint of step 6 and both
  workers restarted by torchrun within the run (the whole job: the killed attempt and the restart that
  resumes from step 6 to the end).
- ``torchrun, 2 nodes``: two simulated nodes of one worker each (two agents, ``--nnodes=1:2``);
- ``2 nodes, 1 lost``: the same, node 1 killed whole right after the checkpoint of step 6, node 0's agent
  restarting its worker alone (the whole job, at world size 1 after the loss);
- ``2 nodes, lost, back``: the same loss, and node 1 back once the job without it published checkpoint 8
  (its next agent joins, torchrun stops the worker and starts both again: the whole job of three attempts).

``first step`` is the time from starting the run to its first ``step_end`` (rendezvous and DDP
construction included), ``whole run`` the uninterrupted 12-step run with one checkpoint (or the whole job
with its restart). Medians over the repetitions; the ratio is the median of per-repetition ratios to the
harness launcher. The machine's load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from pytest_resume_check.builtin.targets import ddp_loop, ddp_torchrun
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records.plan import KillSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    two_nodes = ddp_torchrun.with_options(name="ddp_two_nodes", nnodes=(1, 2), elastic=())
    variants = {"harness launcher": (ddp_loop, None), "torchrun": (ddp_torchrun, None),
                "torchrun, 1 restart": (ddp_torchrun, KillSpec(6, rank=1)),
                "torchrun, 2 nodes": (two_nodes, None), "2 nodes, 1 lost": (two_nodes, KillSpec(6, node=1)),
                "2 nodes, lost, back": (two_nodes, KillSpec(6, node=1, rejoin=8))}
    root = Path(tempfile.mkdtemp(prefix="torchrun-cost-"))
    runner = Runner(seed=1, hang_timeout=120)
    figures: dict[str, dict[str, list[float]]] = {name: {"first step": [], "whole run": []} for name in variants}
    names = list(variants)
    load = os.getloadavg()[0]
    for rep in range(args.reps + 1):  # repetition 0 warms the fork server up and is not counted
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            target, kill = variants[name]
            workdir = Layout(root).fresh(root / f"{name.replace(' ', '').replace(',', '-')}-{rep}")
            plan = runner.plan(target, target.cases[0], workdir, 0, checkpoint_steps=(4,), kill=kill)
            record = runner.run(plan, target)
            if record.outcome != "done":
                sys.exit(f"{name}: the run ended {record.outcome}: {record.describe()}; see {plan.log_path}")
            if rep:
                figures[name]["first step"].append(record.first_step_seconds or float("nan"))
                figures[name]["whole run"].append(record.seconds)
    runner.close()
    load = max(load, os.getloadavg()[0])
    print(f"per run of the two-rank DDP loop, median of {args.reps} (python {sys.version.split()[0]}, "
          f"load average up to {load:.1f}):")
    base = figures[names[0]]["whole run"]
    print(f"  {'variant':22s} {'first step':>11s} {'whole run':>10s}  ratio (whole run)")
    for name in names:
        f = figures[name]
        ratio = statistics.median(v / b for v, b in zip(f["whole run"], base))
        print(f"  {name:22s} {statistics.median(f['first step']) * 1000:8.0f} ms "
              f"{statistics.median(f['whole run']) * 1000:7.0f} ms  {ratio:5.2f}x")


if __name__ == "__main__":
    main()
