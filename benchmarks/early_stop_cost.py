"""What the early-stop rule costs on the bundled matrix. Prints figures; asserts nothing.

    python benchmarks/early_stop_cost.py [--seed 7] [--targets builtin_loop,agentlightning_async,...] [--out DIR]

A resumed run whose state equals the reference's may stop early. The rule ``early_stop="epoch"`` (the
default) takes that stop only at a step that ends an epoch; ``"any"`` (the earlier rule) at the
first equal step. For every one-rank bundled target that reports its state, this runs the quick matrix
of the main job once under each rule, the two side by side (cell by cell, alternating which rule goes
first, so machine noise falls on both alike), with shared first runs as in quick mode, and prints per
target: cells, trainer steps executed (the cost the rule changes, independent of noise), seconds, the
ratio of both, and the cells whose verdicts differ between the rules (the rule must change none on a
correct target: any listed here is a finding).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

#: One-rank bundled targets of the main job that report their state (the others never stop early).
DEFAULT_TARGETS = ("builtin_loop", "agentlightning_async", "agentlightning_sync", "verl_stock_sync")


def bundled(names: list[str]) -> list:
    from agentlightning.verl import resume_target as rt
    from pytest_resume_check.builtin import targets as builtin

    every = {t.name: t for t in [*builtin.TARGETS, *rt.TARGETS]}
    missing = [n for n in names if n not in every]
    if missing:
        sys.exit(f"unknown target(s) {missing}; bundled: {sorted(every)}")
    return [every[n] for n in names]


def measure(target, seed: int, out: Path) -> dict:
    from pytest_resume_check.cells.matrix import QUICK, cells
    from pytest_resume_check.engine import Engine

    rules = {rule: target.with_options(early_stop=rule) for rule in ("any", "epoch")}
    engines = {rule: Engine(out / f"{target.name}-{rule}", seed=seed) for rule in rules}
    figures = {rule: {"seconds": 0.0, "cells": 0} for rule in rules}
    differ = []
    for index, cell in enumerate(cells(target, QUICK, seed)):
        order = ("any", "epoch") if index % 2 == 0 else ("epoch", "any")
        verdicts = {}
        for rule in order:
            ruled = dataclasses.replace(cell, target=rules[rule])
            started = time.monotonic()
            result = engines[rule].run_cell(ruled)
            figures[rule]["seconds"] += time.monotonic() - started
            figures[rule]["cells"] += 1
            verdicts[rule] = (result.verdict.categories, result.verdict.headline)
        if verdicts["any"] != verdicts["epoch"]:
            differ.append(f"{cell.id}: any -> {verdicts['any'][1]} | epoch -> {verdicts['epoch'][1]}")
    for rule in rules:
        figures[rule]["steps"] = engines[rule].runner.steps_executed
        engines[rule].close()
    return {"rules": figures, "differ": differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        total = {"any": [0.0, 0], "epoch": [0.0, 0]}
        print(f"{'target':24} {'cells':>5} {'steps any':>10} {'steps epoch':>12} {'ratio':>6} "
              f"{'s any':>7} {'s epoch':>8} {'ratio':>6}  verdicts differing")
        for target in bundled(args.targets.split(",")):
            got = measure(target, args.seed, out)
            a, e = got["rules"]["any"], got["rules"]["epoch"]
            for rule, f in got["rules"].items():
                total[rule][0] += f["seconds"]
                total[rule][1] += f["steps"]
            steps = f"{a['steps']:>10} {e['steps']:>12} {e['steps'] / a['steps']:>6.2f}"
            seconds = f"{a['seconds']:>7.1f} {e['seconds']:>8.1f} {e['seconds'] / a['seconds']:>6.2f}"
            print(f"{target.name:24} {a['cells']:>5} {steps} {seconds}  {len(got['differ'])}")
            for line in got["differ"]:
                print("    " + line)
        (sa, na), (se, ne) = total["any"], total["epoch"]
        print(f"{'all':24} {'':>5} {na:>10} {ne:>12} {ne / na:>6.2f} {sa:>7.1f} {se:>8.1f} {se / sa:>6.2f}")


if __name__ == "__main__":
    main()
