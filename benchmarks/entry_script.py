"""The main job started as README starts it (``pytest``, a console script) against ``python -m pytest``.
Prints figures; asserts nothing.

    python benchmarks/entry_script.py [--target builtin_loop] [--reps 2] [--against DIR]

Multiprocessing runs the script its starter was started as again in every process it starts, unless that
process has it as ``__main__`` already; ``python -m pytest`` names a module, which it never runs again. So
this prints, for the main job of this checkout (``tests/conftest.py`` declares the bundled targets;
``--target`` narrows it, default ``builtin_loop``, 102 cells), serial, each way: the wall time, the CPU of
pytest and everything it started (rusage of the waited children), and whether every cell's verdict is the
same both ways. ``--against DIR`` runs the same two with the package imported from another checkout (a ``git
worktree`` of an older commit), interleaved with this one in every repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: The console script pip installed beside this interpreter, as README's commands run it.
CONSOLE = Path(sys.executable).parent / "pytest"
WAYS = {"pytest": [str(CONSOLE)], "python -m pytest": [sys.executable, "-m", "pytest"]}


def job(way: str, source: Path, targets: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s, verdicts by cell) of one serial main job."""
    with tempfile.TemporaryDirectory(prefix="entry-script-") as tmp:
        report = Path(tmp) / "cells.json"
        command = [*WAYS[way], "--resume-matrix", "-m", "resume_matrix", "-q", "-p", "no:xdist", "-p",
                   "no:cacheprovider", "--resume-matrix-server=off", "--resume-matrix-seed=1",
                   f"--resume-matrix-json={report}", *(f"--resume-matrix-target={t}" for t in targets)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(command, cwd=HERE, capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(source)})
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cells = json.loads(report.read_text())["cells"] if report.exists() else []
    verdicts = {(c["target"], c["case_id"], c["resume_mode"], json.dumps(c["kill"])):
                (c["status"], c["categories"], c["headline"]) for c in cells}
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run interleaved")
    options = parser.parse_args()
    targets = options.target or ["builtin_loop"]
    sources = {"new": HERE, **({"old": options.against.resolve()} if options.against else {})}
    runs: dict[tuple[str, str], list[tuple[float, float, dict]]] = {}
    for _ in range(options.reps):
        for name, source in sources.items():
            for way in WAYS:
                runs.setdefault((name, way), []).append(job(way, source, targets))
    first = next(iter(runs.values()))[0][2]
    for (name, way), done in runs.items():
        wall, cpu = statistics.median(d[0] for d in done), statistics.median(d[1] for d in done)
        same = all(d[2] == first for d in done)
        print(f"{name:>3} {way:<17} {wall:6.1f} s wall, {cpu:6.1f} CPU s (median of {len(done)}), "
              f"{len(done[0][2])} cells, verdicts as new's first: {same}")
    for name in sources:
        console, module = (statistics.median(d[0] for d in runs[(name, way)]) for way in WAYS)
        print(f"{name}: pytest / python -m pytest = {console / module:.2f}x wall  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
