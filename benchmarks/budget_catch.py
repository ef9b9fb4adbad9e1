"""Which planted bugs ``--resume-matrix-budget`` still catches at a share of the quick matrix's runs.
Prints a table; asserts nothing.

    python benchmarks/budget_catch.py [--shares 10,25,50] [--seed 5]

For each planted target of ``docs/examples/planted`` (each a small loop over a real StatefulDataLoader
with one resume bug) it runs the quick matrix once with a budget of one run to learn how many runs the
whole matrix makes, then with budgets of the given shares of that, and finally whole. A bug counts as
caught when a cell of the session fails or fails as declared (``xfail``: the target declares that bug as
known). The seed is fixed so every share cuts the same matrix.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANTED = Path(__file__).resolve().parents[1] / "docs" / "examples" / "planted"
TARGETS = ("drop_buffer", "reread", "shared_generator", "epoch_reset", "oldest_checkpoint", "no_optimizer",
           "raise_on_resume", "torchdata_sampler")
TOTAL = re.compile(r"of the (\d+) runs of all (\d+) cells")


def session(target: str, budget: int | None, report: Path) -> tuple[str, dict]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
               f"--resume-matrix-target={target}", f"--resume-matrix-seed={ARGS.seed}",
               f"--resume-matrix-json={report}"]
    if budget is not None:
        command.append(f"--resume-matrix-budget={budget}")
    done = subprocess.run(command, cwd=PLANTED, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    data = json.loads(report.read_text()) if report.exists() else {"cells": []}
    report.unlink(missing_ok=True)
    return done.stdout, data


def caught(data: dict) -> bool:
    return any(not c["passed"] or c["status"] == "XFAIL" for c in data["cells"])


def main() -> None:
    shares = [int(s) for s in ARGS.shares.split(",")]
    rows = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cells.json"
        for target in TARGETS:
            out, _ = session(target, 1, report)
            found = TOTAL.search(out)
            if not found:
                print(f"{target}: no budget line\n{out[-2000:]}")
                continue
            total, cells = int(found.group(1)), int(found.group(2))
            row = [target, f"{total} runs, {cells} cells"]
            for share in shares:
                budget = max(1, math.floor(total * share / 100))
                _, data = session(target, budget, report)
                row.append(f"{'caught' if caught(data) else 'missed'} ({len(data['cells'])} cells)")
            _, data = session(target, None, report)
            row.append(f"{'caught' if caught(data) else 'missed'} ({len(data['cells'])} cells)")
            rows.append(row)
    header = ["planted bug", "quick matrix", *(f"{s}% of its runs" for s in shares), "whole matrix"]
    print(f"seed {ARGS.seed}, load {os.getloadavg()[0]:.1f}, {time.monotonic() - started:.0f} s")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for column, share in enumerate(shares, start=2):
        hits = sum(r[column].startswith("caught") for r in rows)
        print(f"{share}%: {hits} of {len(rows)} caught")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="10,25,50")
    parser.add_argument("--seed", type=int, default=5)
    ARGS = parser.parse_args()
    main()
