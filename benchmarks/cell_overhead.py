"""What a cell costs after start-up, against the bare-fork limit, for a trivial trainer. Prints figures;
asserts nothing.

    python benchmarks/cell_overhead.py [--cases 8] [--repeat 3] [--against DIR] [--profile]

- **The bare-fork limit** (per cell): in a process that imported torch, fork a child that runs 4 trivial
  steps, each writing a small checkpoint (a file, published by rename), and stops after its kill step;
  SIGKILL it, fork again, and let the second child resume from the newest checkpoint to step 4. One cell
  per kill step 1..3, so the steps run per cell are those of the harness's cells.
- **The harness** (per cell): the engine driven directly from a script, doing for each cell what the
  pytest plugin does (``Engine.run_cell``, the cell's JSON, and deleting a passed cell's folder), for the
  quick matrix of a trivial target of 4 steps (7 cells a case, one resume mode, no crash cells). Start-up
  is the first case (the fork server, its first runs); the per-cell figure is the time of the other
  ``--cases - 1`` cases' cells divided by their number, so it carries each case's references and shared
  first runs, as a session's per-cell cost does. Each repetition is a fresh process of its own; the
  session's end (``Layout.tidy``, which waits for deletions still running) is printed apart.

``--against DIR`` runs the harness again with the package imported from another checkout (a ``git
worktree`` of an older commit), interleaved with this one in every repetition, and prints both with
their ratio and each one's ratio to the limit. ``--profile`` runs one repetition of this checkout's
harness under cProfile and prints where the driving process spends its own time.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
STEPS = 4

PROJECT = '''
"""A trivial trainer: each step reports one input and publishes a checkpoint of a few bytes."""

import torch  # noqa: F401  (the runs fork from a process that imported torch)

from pytest_resume_check import resume_target

STEPS = 4


def train(run):
    latest = run.checkpoint_dir / "latest"
    start = int(latest.read_text()) if run.resume_mode == "auto" and latest.exists() else 0
    run.resumed(start, run.checkpoint_dir / f"s{start}" if start else None)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            folder = run.checkpoint_dir / f"s{step}"
            folder.mkdir(exist_ok=True)
            (folder / "state").write_text(str(step))
            latest.write_text(str(step))
            run.checkpoint_published(step, folder)


def target(cases):
    return resume_target(train, name="trivial", steps=STEPS, cases=[{"id": f"c{i}"} for i in range(cases)],
                         preload=("torch",), crash_save=False, resume_modes=("auto",))
'''


def _step(folder: Path, step: int) -> None:
    """One trivial step of the limit's trainer: a checkpoint of a few bytes, published by rename."""
    (folder / f"s{step}").write_text(str(step))
    (folder / "latest.tmp").write_text(str(step))
    os.replace(folder / "latest.tmp", folder / "latest")


def limit(cells: int) -> float:
    """Median seconds of one bare-fork cell (fork, steps to the kill step, SIGKILL, fork, resume)."""
    import signal

    import torch  # noqa: F401  (forked from a process that imported torch, as the fork server did)

    times = []
    with tempfile.TemporaryDirectory(prefix="cell-limit-") as tmp:
        for i in range(cells):
            kill = 1 + i % (STEPS - 1)
            folder = Path(tmp) / f"cell{i}"
            folder.mkdir()
            started = time.perf_counter()
            reader, writer = os.pipe()
            pid = os.fork()
            if pid == 0:
                for step in range(1, kill + 1):
                    _step(folder, step)
                os.write(writer, b"k")
                time.sleep(60)
                os._exit(1)
            os.read(reader, 1)  # the child is at its kill point
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(reader)
            os.close(writer)
            pid = os.fork()
            if pid == 0:
                start = int((folder / "latest").read_text())
                for step in range(start + 1, STEPS + 1):
                    _step(folder, step)
                os._exit(0)
            os.waitpid(pid, 0)
            times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def drive(cases: int, out: str) -> None:
    """In a process of its own (``--drive``), with the package from ``PYTHONPATH``: run the matrix through the
    engine as the plugin does and write the figures as JSON to ``out``."""
    import bench_project  # written by the parent

    from pytest_resume_check.cells.matrix import cells
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.report import text as report

    target = bench_project.target(cases)
    matrix = cells(target, "quick", 0)
    first = matrix[0].case_id
    with tempfile.TemporaryDirectory(prefix="cell-overhead-") as tmp:
        engine = Engine(Path(tmp) / "session", seed=0)
        engine.register(matrix)
        engine.add_preload(target.preload)
        started = time.perf_counter()
        timed, mark, verdicts = 0, started, []
        for cell in matrix:
            if mark == started and cell.case_id != first:
                mark, timed = time.perf_counter(), 0
            result = engine.run_cell(cell)
            verdicts.append([cell.case_id, cell.kill_id, list(result.verdict.categories), result.verdict.headline])
            report.cell_json(result)
            if result.passed and result.workdir is not None:
                engine.layout.remove(result.workdir)
            timed += 1
        ended = time.perf_counter()
        engine.close()
        engine.stop_server()
        engine.layout.tidy()
        tidied = time.perf_counter()
        left = sorted(str(p.relative_to(engine.root)) for p in engine.root.rglob("*"))
    Path(out).write_text(json.dumps({"startup": mark - started, "per_cell": (ended - mark) / timed, "cells": timed,
                                     "end": tidied - ended, "left": left, "verdicts": verdicts}))


def harness(source: Path, cases: int, project: Path, profile: Path | None = None) -> dict:
    """One fresh driving process with the package imported from ``source``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        runner = ["-m", "cProfile", "-o", str(profile)] if profile else []
        subprocess.run([sys.executable, *runner, __file__, "--drive", out.name, "--cases", str(cases)], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(project)]),
                            "PYTHONWARNINGS": "ignore"})
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8, help="cases of the trivial target (7 cells each)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run interleaved")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--drive", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.drive:
        drive(options.cases, options.drive)
        return
    sources = {"new": HERE, **({"old": options.against.resolve()} if options.against else {})}
    with tempfile.TemporaryDirectory(prefix="cell-overhead-project-") as tmp:
        project = Path(tmp)
        (project / "bench_project.py").write_text(PROJECT)
        figures: dict[str, list[dict]] = {name: [] for name in sources}
        limits = []
        for _ in range(options.repeat):
            limits.append(limit(7 * options.cases))
            for name, source in sources.items():
                figures[name].append(harness(source, options.cases, project))
        bare = statistics.median(limits)
        print(f"bare-fork limit: {bare * 1000:.1f} ms a cell (median of {options.repeat} medians)")
        per = {}
        for name, runs in figures.items():
            per[name] = statistics.median(r["per_cell"] for r in runs)
            print(f"{name:>4} ({sources[name]}): {per[name] * 1000:.1f} ms a cell after start-up "
                  f"({runs[0]['cells']} cells; {per[name] / bare:.2f}x the limit), start-up "
                  f"{statistics.median(r['startup'] for r in runs):.2f} s, session end "
                  f"{statistics.median(r['end'] for r in runs) * 1000:.0f} ms, left in the root: "
                  f"{max(len(r['left']) for r in runs)} paths")
        if "old" in per:
            same = all(a["verdicts"] == b["verdicts"] for a, b in zip(figures["new"], figures["old"]))
            print(f"new / old: {per['new'] / per['old']:.2f}x a cell; verdicts identical: {same}  "
                  f"(load {os.getloadavg()[0]:.1f})")
        if options.profile:
            out = project / "driver.prof"
            harness(HERE, options.cases, project, out)
            print("the driving process, by own time (tottime), top 25:")
            pstats.Stats(str(out)).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
