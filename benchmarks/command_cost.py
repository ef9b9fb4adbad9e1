"""Cost per run of a command target against the same trainer as a forked Python target. Prints figures;
asserts nothing.

    python benchmarks/command_cost.py [--reps 15]

The trainer is ``pytest_resume_check.builtin.train_script`` (plain Python, 12 steps, a checkpoint at step
6). Three targets run it, each an uninterrupted supervised run through the engine's runner, interleaved
in every repetition (order rotated):

- ``forked``: a Python target that calls ``train_script.main(argv, run)`` with its ``RunContext``, in a
  child forked from the preloaded fork server (what a Python target costs);
- ``command``: ``script_example``'s command (``{python} -m ...``, reporting through
  ``pytest_resume_check.client``), which runs in the run's own process, forked from the server that
  preloaded what the script imports;
- ``command fresh``: the same with ``fresh_interpreter=True``: a fresh interpreter per run, reporting over
  the socket (as every command ran before scripts ran in the run's process);
- with --torch, ``torch script`` and ``torch script fresh``: a script file that imports torch at its top and
  then runs the same ``main`` (torch must be installed), in the run's process and as its own process.

A fresh interpreter pays its start-up (and every import the script makes) in every run, where a program run
in the run's process pays them once in the fork server. Figures are medians over the repetitions; the
ratio is the median of per-repetition ratios to ``forked``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pytest_resume_check.builtin import train_script
from pytest_resume_check.builtin.targets import script_example
from pytest_resume_check.process.layout import Layout
from pytest_resume_check.process.runner import Runner
from pytest_resume_check.records.plan import CommandSpec
from pytest_resume_check.targets import resume_target

CASE = script_example.cases[0]


def in_process(run) -> None:
    """The script as a forked Python target: the same ``main``, reporting to the RunContext directly."""
    argv = ["--out", str(run.checkpoint_dir), "--resume", run.resume_mode, "--seed", str(run.seed),
            "--epochs", str(run.case["epochs"]), "--shuffle", str(run.case["shuffle"])]
    train_script.main(argv, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--torch", action="store_true", help="also a command that imports torch")
    args = parser.parse_args()
    spec = script_example.command
    targets = {"forked": resume_target(in_process, name="forked", steps=12, preload=("pytest_resume_check.builtin."
                                                                                     "train_script",)),
               "command": script_example,
               "command fresh": script_example.with_options(name="command_fresh",
                                                            command=replace(spec, fresh_interpreter=True))}
    root = Path(tempfile.mkdtemp(prefix="command-cost-"))
    if args.torch:
        script = root / "torch_script.py"
        script.write_text("import torch\n\nfrom pytest_resume_check.builtin import train_script\n\n"
                          "if __name__ == '__main__':\n    train_script.main()\n")
        torch_spec = CommandSpec(("{python}", str(script)) + spec.argv[3:], spec.cwd, spec.env)
        targets["torch script"] = script_example.with_options(name="torch_script", command=torch_spec)
        targets["torch script fresh"] = script_example.with_options(
            name="torch_script_fresh", command=replace(torch_spec, fresh_interpreter=True))
    runner = Runner(seed=1, hang_timeout=120)
    seconds: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for rep in range(args.reps + 1):  # repetition 0 warms the fork server up and is not counted
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            target = targets[name]
            workdir = Layout(root).fresh(root / f"{name}-{rep}")
            plan = runner.plan(target, CASE, workdir, 0, checkpoint_steps=(6,))
            start = time.perf_counter()
            record = runner.run(plan, target)
            took = time.perf_counter() - start
            if record.outcome != "done":
                sys.exit(f"{name}: the run ended {record.outcome}: {record.describe()}")
            if rep:
                seconds[name].append(took)
    print(f"per uninterrupted run of 12 steps, median of {args.reps} (python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}):")
    base = seconds["forked"]
    for name, values in seconds.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"  {name:18s} {statistics.median(values) * 1000:8.1f} ms   {ratio:5.2f}x forked")


if __name__ == "__main__":
    main()
