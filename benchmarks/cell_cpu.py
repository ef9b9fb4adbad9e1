"""Where a cell's CPU goes, and the main job's CPU per cell. Prints figures; asserts nothing.

    python benchmarks/cell_cpu.py [--seed 1234] [--target NAME ...] [--against DIR] [--profile]

Runs the main job (``pytest --resume-matrix -m resume_matrix``, serial, from this checkout, whose
``tests/conftest.py`` declares the bundled targets; ``--target`` narrows it) and prints its wall time,
the CPU of the pytest process and everything it started (user and system apart, from the rusage of the
waited children), cells, and CPU per cell. ``--against DIR`` runs the same job with the package imported
from another checkout (a ``git worktree`` of an older commit) right after, side by side. ``--profile``
runs pytest itself under cProfile and prints where the harness's own process spends its CPU (the runs
are other processes: forked children whose CPU the rusage line counts).
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def job(seed: int, targets: list[str], source: Path, profile: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="cell-cpu-") as tmp:
        runner = ["-m", "cProfile", "-o", str(profile), "-m", "pytest"] if profile else ["-m", "pytest"]
        command = [sys.executable, *runner, "--resume-matrix", "-m", "resume_matrix", "-q", "-p", "no:xdist",
                   "-p", "no:cacheprovider", f"--resume-matrix-seed={seed}",
                   *(f"--resume-matrix-target={t}" for t in targets)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(command, cwd=HERE, capture_output=True, text=True,
                              env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(source)})
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    found = re.search(r"resume matrix: (\d+) cells", done.stdout)
    cells = int(found.group(1)) if found else 0
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    per = (user + system) / cells if cells else float("nan")
    print(f"{str(source):<28} {wall:6.1f} s wall, CPU {user + system:6.1f} s (user {user:.1f}, system {system:.1f}), "
          f"{cells} cells: {per * 1000:.0f} ms CPU a cell, {cells / wall:.2f} cells/s  | {last}  (load "
          f"{os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run second")
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    job(options.seed, options.target, HERE)
    if options.against is not None:
        job(options.seed, options.target, options.against.resolve())
    if options.profile:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "pytest.prof"
            job(options.seed, options.target, HERE, out)
            stats = pstats.Stats(str(out))
            print("the pytest process, by own time (tottime), top 25:")
            stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
