"""Speed of the resume matrix on the bundled Agent Lightning async target. Prints figures; asserts nothing.

    python benchmarks/matrix_speed.py [--runs 20] [--spawn-cells 6] [--out /tmp/bench]

1. Start-up: seconds from starting a child to its first event, preloaded fork server vs spawn
   (median of --runs runs each), and their ratio.
2. Wall time of the default quick matrix of agentlightning_async through pytest, with the fork server;
   the same matrix with spawn is timed on its first --spawn-cells cells and extrapolated (labelled so).
3. Trainer steps executed for N = 10, 20, 40 kill points (a run of N steps, killed after every step),
   with the shortcuts (shared first runs, early stop by state) and without them.
4. Harness overhead per trainer step: fit() with the observer off vs reporting every event through a
   real pipe to a reader.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pipe
from pathlib import Path


def startup(out: Path, runs: int) -> dict[str, float]:
    from agentlightning.verl import resume_target as rt
    from pytest_resume_check.engine import Engine

    figures = {}
    case = rt.ASYNC_CASES[0]
    for isolation in ("forkserver", "spawn"):
        engine = Engine(out / f"startup-{isolation}", seed=0, isolation=isolation, check_determinism=False)
        times = []
        for i in range(runs):
            plan = engine.plan(rt.agentlightning_async, case, out / f"startup-{isolation}" / f"r{i}", 0,
                               resume_mode="disabled")
            record = engine.run(plan, rt.agentlightning_async)
            assert record.outcome == "done", record.error
            times.append(record.first_event_seconds)
        figures[isolation] = statistics.median(times[1:] if isolation == "forkserver" else times)
    return figures


def matrix_wall(out: Path, spawn_cells: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--resume-matrix",
            "--resume-matrix-target=agentlightning_async", "--resume-matrix-seed=0", "-m", "resume_matrix"]
    figures = {}
    with tempfile.TemporaryDirectory() as empty:
        started = time.monotonic()
        done = subprocess.run(base, cwd=empty, env=env, capture_output=True, text=True)
        figures["fork"] = time.monotonic() - started
        figures["cells"] = float(_passed(done.stdout))
        listing = subprocess.run([*base, "--collect-only"], cwd=empty, env=env, capture_output=True, text=True)
        names = [ln.split("::", 1)[1] for ln in listing.stdout.splitlines() if ln.startswith("resume-matrix::")]
        started = time.monotonic()
        for name in names[:spawn_cells]:
            subprocess.run([*base, "--resume-matrix-isolation=spawn", f"--resume-matrix-cell={name}"],
                           cwd=empty, env=env, capture_output=True, text=True)
        per_cell = (time.monotonic() - started) / max(1, min(spawn_cells, len(names)))
        figures["spawn_extrapolated"] = per_cell * len(names)
        figures["spawn_cells_measured"] = float(min(spawn_cells, len(names)))
    return figures


def _passed(stdout: str) -> int:
    for line in stdout.splitlines()[::-1]:
        if " passed" in line:
            return int(line.split(" passed")[0].split()[-1])
    return 0


def steps_executed(out: Path, kill_points: int, share: bool) -> int:
    from agentlightning.verl import resume_target as rt
    from pytest_resume_check.cells.matrix import Cell
    from pytest_resume_check.engine import Engine
    from pytest_resume_check.run import KillSpec

    # A run of exactly `kill_points` steps: refill 6 per step over 2 epochs.
    n = 4 * ((3 * kill_points + 3) // 4)
    case = {"id": f"steps{kill_points}", "n": n, "refill": 6}
    steps = rt.async_steps(case)
    target = rt.agentlightning_async
    cells = [Cell(target, case, "auto", (KillSpec(k),), steps, None, tuple(range(1, k))) for k in range(1, steps + 1)]
    engine = Engine(out / f"steps-{kill_points}-{share}", seed=0, share=share)
    engine.register(cells)
    for cell in cells:
        result = engine.run_cell(cell)
        assert result.passed, result.verdict.headline
    return engine.steps_executed, steps


def overhead_per_step(repeat: int = 3) -> dict[str, float]:
    from agentlightning.verl import resume_target as rt
    from agentlightning.verl.cpu_builder import build_cpu_trainer
    from pytest_resume_check.child.main import ConnectionSink
    from pytest_resume_check.run import RunContext, RunPlan

    reader, writer = Pipe(duplex=False)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if reader.poll(0.05):
                reader.recv_bytes()

    threading.Thread(target=drain, daemon=True).start()
    figures: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeat):
        for mode in ("off", "on"):
            with tempfile.TemporaryDirectory() as tmp:
                trainer = build_cpu_trainer(tmp, dataset_size=240, total_epochs=2, resume_mode="disable")
                if mode == "on":
                    plan = RunPlan("bench", ("", "", ""), {}, 0, tmp, os.devnull, resume_mode="disabled")
                    trainer.input_observer = rt.RunObserver(RunContext(plan, ConnectionSink(writer)))
                started = time.perf_counter()
                trainer.fit()
                figures[mode].append((time.perf_counter() - started) / (trainer.global_steps - 1))
    stop.set()
    return {k: statistics.median(v) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spawn-cells", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="resume-bench-")))
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; output under {args.out}")

    s = startup(args.out, args.runs)
    print(f"\n1. start-up (start -> first event, median of {args.runs} runs)")
    print(f"   fork server (preloaded) {s['forkserver'] * 1000:8.1f} ms")
    print(f"   spawn                   {s['spawn'] * 1000:8.1f} ms")
    print(f"   ratio spawn / fork      {s['spawn'] / s['forkserver']:8.1f}x")

    w = matrix_wall(args.out, args.spawn_cells)
    print(f"\n2. default quick matrix of agentlightning_async ({int(w['cells'])} cells)")
    print(f"   fork server             {w['fork']:8.1f} s wall")
    print(f"   spawn (extrapolated from {int(w['spawn_cells_measured'])} cells) {w['spawn_extrapolated']:8.1f} s wall")

    print("\n3. trainer steps executed, a run of N steps killed after every step (N kill points)")
    print("   N    steps(shortcuts)  steps(exhaustive)")
    rows = {}
    for n in (10, 20, 40):
        fast, steps = steps_executed(args.out, n, True)
        slow, _ = steps_executed(args.out, n, False)
        rows[n] = (fast, slow)
        print(f"   {steps:<4} {fast:>16}  {slow:>17}")
    print(f"   growth N=40 / N=10:  shortcuts {rows[40][0] / rows[10][0]:.2f}x   "
          f"exhaustive {rows[40][1] / rows[10][1]:.2f}x")

    o = overhead_per_step()
    print("\n4. harness overhead per trainer step (fit() in process, median of 3)")
    print(f"   observer off  {o['off'] * 1000:7.2f} ms/step")
    print(f"   events on     {o['on'] * 1000:7.2f} ms/step   (+{(o['on'] - o['off']) * 1000:.2f} ms)")


if __name__ == "__main__":
    main()
