"""Serial against ``-n 2`` on the bundled default quick matrix. Prints figures; asserts nothing.

    python benchmarks/xdist_speed.py [--reps 2] [--seed 1234] [--target NAME ...]

Runs ``pytest --resume-matrix -m resume_matrix`` from this checkout (its ``tests/conftest.py`` declares the
bundled targets) once without xdist (``-p no:xdist``) and once with ``-n 2``, alternating which goes first
in each repetition, with one seed and a private TMPDIR per invocation. Prints each invocation's wall time
and cells, the median of the per-repetition ratios serial / ``-n 2`` (issue 14's goal: at least 1.5 on two
cores), and the machine's core count. Before issue 14 each worker made every case's reference runs again
and two workers were no faster than one; now each case's cells go to one worker.
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

HERE = Path(__file__).resolve().parent.parent


def run(args: list[str], seed: int, targets: list[str]) -> tuple[float, int, str]:
    """One pytest invocation: (wall seconds, cells, last line)."""
    with tempfile.TemporaryDirectory(prefix="xdist-speed-") as tmp:
        command = [sys.executable, "-m", "pytest", "--resume-matrix", "-m", "resume_matrix", "-q",
                   "-p", "no:cacheprovider", f"--resume-matrix-seed={seed}",
                   *(f"--resume-matrix-target={t}" for t in targets), *args]
        started = time.monotonic()
        done = subprocess.run(command, cwd=HERE, capture_output=True, text=True, env={**os.environ, "TMPDIR": tmp})
        seconds = time.monotonic() - started
    found = re.search(r"resume matrix: (\d+) cells", done.stdout)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    return seconds, int(found.group(1)) if found else 0, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--target", action="append", default=[], help="only these bundled targets")
    options = parser.parse_args()
    modes = {"serial": ["-p", "no:xdist"], "-n 2": ["-n", "2"]}
    print(f"cores: {os.cpu_count()}; seed {options.seed}; targets: {', '.join(options.target) or 'all bundled'}")
    ratios = []
    for rep in range(options.reps):
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        times = {}
        for name in order:
            seconds, cells, last = run(modes[name], options.seed, options.target)
            times[name] = seconds
            print(f"rep {rep + 1} {name:>6}: {seconds:6.1f} s, {cells} cells ({last})")
        ratios.append(times["serial"] / times["-n 2"])
    print(f"serial / -n 2: median {statistics.median(ratios):.2f}x over {len(ratios)} repetitions "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
