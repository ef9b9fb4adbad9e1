"""The rerun line of one cell: a fresh pytest that runs one cell of a small torch project, with the session's own
fork server (``--resume-matrix-server=off``, what every session did before) and with the shared one found warm
(``on``, a second invocation). Prints figures; asserts nothing.

    python benchmarks/rerun_line.py [--reps 3] [--seed 1234] [--cell 'loop[c0-auto-ckpt3]']

The project is the plain PyTorch loop of ``benchmarks/xdist_speed.py`` with one case. Each repetition runs the
cell's rerun line once with ``off`` and once with ``on`` (alternating which goes first), after one ``on`` run
that starts the shared server (cold, not counted), all with one TMPDIR, so the server stays warm. For each it
prints the wall seconds of the whole invocation and the cell's own run time (the sum of its runs' seconds in
the cell JSON); the goal is at most 2x the cell's own time plus 1 s. The shared server is ended at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "benchmarks"))
from xdist_speed import user_project  # noqa: E402  (the plain torch loop, declared as a user would)


def rerun(project: Path, cell: str, seed: int, server: str, tmp: str) -> tuple[float, float, str]:
    """One rerun line: (wall seconds, the cell's own run seconds, the server line)."""
    out = Path(tmp) / "cell.json"
    command = [sys.executable, "-m", "pytest", "--resume-matrix", "-q", "-p", "no:cacheprovider",
               f"--resume-matrix-seed={seed}", f"--resume-matrix-cell={cell}", f"--resume-matrix-server={server}",
               f"--resume-matrix-json={out}"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=project, capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(project)})
    seconds = time.monotonic() - started
    try:
        cells = json.loads(out.read_text())["cells"]
        own = sum(run["seconds"] for cell_json in cells for run in cell_json["runs"])
    except (OSError, ValueError, KeyError):
        own = float("nan")
    line = next((line for line in done.stdout.splitlines() if line.startswith("resume-check: ")
                 and (" warm" in line or " cold" in line)), done.stdout.strip().splitlines()[-1:] or ["?"])
    return seconds, own, str(line)


def end_servers(tmp: str) -> None:
    """End the keepers of the shared servers started under ``tmp``."""
    root = Path(tmp) / f"pytest-resume-check-{os.getuid()}"
    for record in root.glob("*/server.json"):
        try:
            os.kill(json.loads(record.read_text())["keeper"], signal.SIGTERM)
        except (OSError, ValueError, KeyError):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--cell", default="loop[c0-auto-ckpt3]")
    options = parser.parse_args()
    print(f"cores: {os.cpu_count()}; seed {options.seed}; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="rerun-", dir="/tmp") as tmp:
        project = user_project(Path(tmp), "project", 1)
        try:
            seconds, own, line = rerun(project, options.cell, options.seed, "on", tmp)
            print(f"first 'on' (not counted): {seconds:5.2f} s wall, cell {own:.2f} s; {line}")
            figures: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            for rep in range(options.reps):
                for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                    seconds, own, line = rerun(project, options.cell, options.seed, mode, tmp)
                    figures[mode].append((seconds, own))
                    print(f"rep {rep + 1} {mode:>3}: {seconds:5.2f} s wall, cell {own:.2f} s; {line}")
        finally:
            end_servers(tmp)
    wall = {mode: statistics.median(s for s, _ in runs) for mode, runs in figures.items()}
    own = statistics.median(o for runs in figures.values() for _, o in runs)
    print(f"median wall: off {wall['off']:.2f} s, on (warm) {wall['on']:.2f} s; "
          f"off / on {wall['off'] / wall['on']:.2f}x; cell's own runs {own:.2f} s, "
          f"goal 2x + 1 s = {2 * own + 1:.2f} s; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
