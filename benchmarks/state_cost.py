"""Cost of reporting training state (``run.state``). Prints figures; asserts nothing.

    python benchmarks/state_cost.py [--reps 30] [--matrix-reps 2] [--quick] [--skip-matrix] [--throughput-mb 1024]

0. What a leaf digest of one big tensor costs (1 GB by default): MB/s of XXH3-128 (the digests where the
   ``xxhash`` package is installed), of SHA-256 (where it is not) and of a plain memory copy, side by side.
1. Per-step cost of ``RunContext.state`` in process, for an ``nn.Linear(1000, 1000)`` (1.0M parameters)
   trained with Adam on the CPU (state: model, optimizer with both Adam moments, torch's global RNG):
   (a) the training step alone; (b) step + ``run.state`` digesting every leaf (a reference or resumed
   run; ``b256``: the same with SHA-256 digests, as where ``xxhash`` is missing); (c) the same call in a
   run whose state is not compared (a first run that will be killed);
   (d) tolerance mode writing the plain values (the first reference run); (e) tolerance mode comparing
   with the values (d) wrote, every step. Each mode has its own identically seeded model, so (e) sees
   exactly (d)'s values and compares every leaf. The modes are interleaved in each repetition (order
   rotated); figures are medians over the repetitions, ratios are medians of the per-repetition ratios
   to (a). The RunContext is built in process over a sink that discards events, as
   ``pytest_resume_check.builtin.loop.warm_up`` builds one.
2. Wall time of the bundled default quick matrix before the feature (commit de17445, checked out in a
   temporary git worktree) and after it (this checkout, as it is on disk), one target per pytest
   invocation, invocations alternating old/new. Each invocation runs in its tree with that tree on
   PYTHONPATH, so it imports its own package (the venv's editable install points at this checkout);
   the script prints where each tree imports the package from. Each invocation also gets a private
   TMPDIR, so no other pytest session on the machine prunes its session folder. Cells, the cells' runs
   (first and resumed runs; reference runs are not listed there) and those runs' summed seconds come
   from ``--resume-matrix-json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
OLD_COMMIT = "de17445"
TARGETS = ("builtin_loop", "agentlightning_async")
MODES = ("a", "b", "b256", "c", "d", "e")
LABELS = {
    "a": "training step alone",
    "b": "+ state, exact (digests)",
    "b256": "+ state, exact, SHA-256 digests",
    "c": "+ state, report_state=False",
    "d": "+ state, tolerance, writing",
    "e": "+ state, tolerance, comparing",
}


# -- 1. per-step cost in process ------------------------------------------------------------------

class _Sink:
    """Discards events; keeps only what the checks at the end need (how many STATE events, and
    whether every compared component was close)."""

    def __init__(self) -> None:
        self.states = 0
        self.compared = 0
        self.not_close = 0

    def send(self, event: Any) -> None:
        extra = getattr(event, "extra", None) or {}
        if event.kind == "state":
            self.states += 1
            compared = extra.get("compared")
            if compared:
                self.compared += 1
                self.not_close += sum(1 for v in compared.values() if v is not None)


class _Trainer:
    """nn.Linear(1000, 1000) + Adam on a fixed batch: identical seeds give identical states."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        torch.manual_seed(0)
        self.model = torch.nn.Linear(1000, 1000)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 1000, generator=g)
        self.y = torch.randn(64, 1000, generator=g)
        self.step = 0

    def train_step(self) -> None:
        loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.step += 1

    def components(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "rng": self.torch.get_rng_state()}


def state_cost(reps: int, steps_per_rep: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)

    from pytest_resume_check.run import RESUME_DISABLED, RunContext, RunPlan

    tmp = Path(tempfile.mkdtemp(prefix="state-cost-values-"))
    values, scratch = tmp / "values", tmp / "ckpt"
    values.mkdir()
    scratch.mkdir()

    def context(**options: Any) -> tuple[RunContext, _Sink]:
        plan = RunPlan("bench", ("", "", ""), {}, 0, str(scratch), os.devnull, resume_mode=RESUME_DISABLED,
                       **options)
        sink = _Sink()
        return RunContext(plan, sink), sink

    tol = (1e-5, 1e-8)
    runs = {
        "a": (None, None),
        "b": context(report_state=True),
        "b256": context(report_state=True),
        "c": context(report_state=False),
        "d": context(report_state=True, state_tolerance=tol, state_values_dir=str(values)),
        "e": context(report_state=True, state_tolerance=tol, state_reference_dir=str(values), is_resume=False),
    }
    trainers = {m: _Trainer(torch) for m in MODES}

    from pytest_resume_check.records import state as records_state

    fast = records_state._hasher

    def block(mode: str) -> float:
        trainer, (run, _) = trainers[mode], runs[mode]
        # (b256): the digests made where xxhash is missing, side by side with (b)'s
        records_state._hasher = (lambda: ("", hashlib.sha256)) if mode == "b256" else fast  # type: ignore
        started = time.perf_counter()
        for _ in range(steps_per_rep):
            trainer.train_step()
            if run is not None:
                run.state(trainer.step, trainer.components())
        took = (time.perf_counter() - started) / steps_per_rep
        records_state._hasher = fast
        return took

    # Context figure: sha256 of the same tensor bytes in one pass.

    def sha_alone() -> float:
        t = trainers["a"]
        tensors = [*t.model.state_dict().values()]
        for s in t.optimizer.state.values():
            tensors += [v for v in s.values() if torch.is_tensor(v)]
        started = time.perf_counter()
        for _ in range(steps_per_rep):
            h = hashlib.sha256()
            for v in tensors:
                h.update(memoryview(v.detach().contiguous().reshape(-1).numpy()).cast("B"))
        return (time.perf_counter() - started) / steps_per_rep

    units = [["a"], ["b"], ["b256"], ["c"], ["d", "e"], ["sha"]]
    times: dict[str, list[float]] = {m: [] for m in [*MODES, "sha"]}
    for rep in range(reps + 1):  # repetition 0 warms up (Adam's state, first pickle) and is not kept
        order = units[rep % len(units):] + units[:rep % len(units)]
        for unit in order:
            for mode in unit:
                took = sha_alone() if mode == "sha" else block(mode)
                if rep:
                    times[mode].append(took)
        for f in values.glob("step_*.pkl"):  # compared by (e) already; keep the temp folder small
            f.unlink()
    state_bytes = sum(v.numel() * v.element_size() for v in trainers["a"].model.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in trainers["a"].optimizer.state.values()
                       for v in s.values() if torch.is_tensor(v))
    state_bytes += torch.get_rng_state().numel()
    params = sum(p.numel() for p in trainers["a"].model.parameters())
    for f in values.glob("*"):
        f.unlink()
    values.rmdir()
    scratch.rmdir()
    tmp.rmdir()
    return {
        "times": times,
        "params": params,
        "state_bytes": state_bytes,
        "threads": torch.get_num_threads(),
        "sinks": {m: runs[m][1] for m in MODES if runs[m][1] is not None},
        "steps": trainers["a"].step,
    }


def print_state_cost(r: dict[str, Any], reps: int, steps_per_rep: int) -> None:
    t = r["times"]
    print(f"\n1. per-step cost of run.state: nn.Linear(1000, 1000) ({r['params'] / 1e6:.3f}M params) + Adam, CPU, "
          f"{r['threads']} torch threads")
    print(f"   state reported: model, optimizer, rng = {r['state_bytes'] / 1e6:.1f} MB of tensors per step")
    print(f"   median over {reps} interleaved repetitions of {steps_per_rep} steps each")
    print("          mode                              ms/step   ratio to (a)   extra ms/step")
    base = statistics.median(t["a"])
    for m in MODES:
        med = statistics.median(t[m])
        ratio = statistics.median(x / a for x, a in zip(t[m], t["a"]))
        mode = f"({m})"
        print(f"   {mode:<6} {LABELS[m]:<32} {med * 1000:8.2f}   {ratio:10.2f}x   {(med - base) * 1000:+10.2f}")
    sha = statistics.median(t["sha"])
    print(f"   context: sha256 of the same tensor bytes alone, one pass: {sha * 1000:.2f} ms "
          f"({r['state_bytes'] / sha / 1e6:.0f} MB/s)")
    s = r["sinks"]
    print(f"   checks: (b) sent {s['b'].states} STATE events; (c) sent {s['c'].states}; (d) sent {s['d'].states}; "
          f"(e) compared {s['e'].compared} of {s['e'].states} steps, {s['e'].not_close} component(s) not close")


def throughput(megabytes: int, reps: int = 3) -> dict[str, float]:
    """MB/s of a leaf digest of one float32 tensor of ``megabytes`` MB, XXH3-128 and SHA-256, and of a plain
    memory copy of it (``clone``), best of ``reps`` each, interleaved."""
    import torch

    from pytest_resume_check.records import state as records_state

    tensor = torch.randn(megabytes * (1 << 20) // 4)
    fast = records_state._hasher
    kinds = {"xxh3-128": fast, "sha256": lambda: ("", hashlib.sha256)}
    best = {name: float("inf") for name in [*kinds, "copy"]}
    for _ in range(reps):
        for name, hasher in kinds.items():
            records_state._hasher = hasher  # type: ignore
            started = time.perf_counter()
            records_state.leaf_digest(tensor)
            best[name] = min(best[name], time.perf_counter() - started)
        records_state._hasher = fast
        started = time.perf_counter()
        tensor.clone()
        best["copy"] = min(best["copy"], time.perf_counter() - started)
    return {name: megabytes * (1 << 20) / 1e6 / seconds for name, seconds in best.items()}


def print_throughput(r: dict[str, float], megabytes: int) -> None:
    print(f"\n0. digest throughput, one float32 tensor of {megabytes} MB (best of 3, interleaved)")
    for name, rate in r.items():
        print(f"   {name:<9} {rate:9.0f} MB/s   {r['copy'] / rate:5.2f}x a memory copy's time")


# -- 2. bundled matrix, before vs after -----------------------------------------------------------

def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(HERE), *args], check=True, capture_output=True, text=True).stdout


def _env(tree: Path, tmpdir: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


def _state(tree: Path) -> str:
    """The tree's commit and how many paths differ from it (the checkout may be edited meanwhile)."""
    head = _git("-C", str(tree), "rev-parse", "--short", "HEAD").strip()
    dirty = [ln for ln in _git("-C", str(tree), "status", "--short").splitlines() if ln.strip()]
    return head + (f" + {len(dirty)} uncommitted path(s)" if dirty else "")


def _where(tree: Path) -> str:
    code = "import pytest_resume_check, agentlightning; print(pytest_resume_check.__file__, agentlightning.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=_env(tree), capture_output=True, text=True)
    return (done.stdout or done.stderr).strip()


def _summary(stdout: str) -> str:
    for line in stdout.splitlines()[::-1]:
        if re.search(r"\b(passed|failed|error|errors|no tests ran)\b", line) and " in " in line:
            return line.strip("= ").strip()
    return "(no summary line)"


def _from_json(path: Path) -> tuple[int, int, float]:
    """Cells, the cells' runs and those runs' summed seconds of one invocation."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return 0, 0, 0.0
    runs = [r for c in cells for r in c.get("runs", [])]
    return len(cells), len(runs), sum(r.get("seconds", 0.0) for r in runs)


def matrix_wall(reps: int, targets: tuple[str, ...]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="state-cost-matrix-"))
    old = tmp / f"tree-{OLD_COMMIT}"
    _git("worktree", "add", "--detach", str(old), OLD_COMMIT)
    trees = {"before": old, "after": HERE}
    rows: list[dict[str, Any]] = []
    try:
        print("\n2. bundled default quick matrix, before vs after "
              "(pytest -p no:cacheprovider --resume-matrix -m resume_matrix -n 2 -q --resume-matrix-seed=1 "
              "--resume-matrix-target=T)")
        for label, tree in trees.items():
            print(f"   {label:<6} tree {tree} at {_state(tree)}")
            print(f"          imports {_where(tree)}")
        for target in targets:
            for rep in range(reps):
                for label, tree in trees.items():
                    out = tmp / f"{target}-{label}-{rep}.json"
                    # A private TMPDIR: the plugin prunes all but the newest session folders under
                    # $TMPDIR/pytest-resume-check-USER, so other pytest sessions on a shared machine
                    # would delete this one's folder while it runs (its cells then crash).
                    private = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=tmp))
                    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--resume-matrix", "-m",
                           "resume_matrix", "-n", "2", "-q", "--resume-matrix-seed=1",
                           f"--resume-matrix-target={target}", f"--resume-matrix-json={out}"]
                    started = time.monotonic()
                    done = subprocess.run(cmd, cwd=tree, env=_env(tree, private), capture_output=True, text=True)
                    wall = time.monotonic() - started
                    shutil.rmtree(private, ignore_errors=True)
                    cells, runs, child_s = _from_json(out)
                    row = {"target": target, "label": label, "rep": rep, "wall": wall, "rc": done.returncode,
                           "summary": _summary(done.stdout), "cells": cells, "runs": runs, "child_s": child_s}
                    rows.append(row)
                    print(f"   {target:<21} {label:<6} #{rep + 1}  {wall:7.1f} s wall  rc={done.returncode}  "
                          f"{cells} cells, {runs} cell runs, {child_s:7.1f} s in them  | {row['summary']}",
                          flush=True)
                    if done.returncode != 0:
                        print("      " + "\n      ".join((done.stdout + done.stderr).splitlines()[-15:]))
                    if label == "after":
                        print(f"      (after tree now at {_state(tree)})")
    finally:
        subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(old)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows}


def print_matrix(m: dict[str, Any], targets: tuple[str, ...]) -> None:
    print("\n   medians (wall s; cell runs; their summed seconds)")
    for target in targets:
        med = {}
        for label in ("before", "after"):
            rows = [r for r in m["rows"] if r["target"] == target and r["label"] == label]
            med[label] = (statistics.median(r["wall"] for r in rows), statistics.median(r["runs"] for r in rows),
                          statistics.median(r["child_s"] for r in rows))
        b, a = med["before"], med["after"]
        pairs = [(r0["wall"], r1["wall"]) for r0 in m["rows"] for r1 in m["rows"]
                 if r0["target"] == r1["target"] == target and r0["rep"] == r1["rep"]
                 and r0["label"] == "before" and r1["label"] == "after"]
        paired = statistics.median(a1 / b0 for b0, a1 in pairs)
        print(f"   {target:<21} before {b[0]:7.1f} s ({b[1]:.0f} runs, {b[2]:.1f} s)   "
              f"after {a[0]:7.1f} s ({a[1]:.0f} runs, {a[2]:.1f} s)   "
              f"after/before {a[0] / b[0]:.2f}x (median of paired ratios {paired:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30, help="interleaved repetitions in part 1")
    parser.add_argument("--steps", type=int, default=3, help="training steps per mode per repetition")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in part 1 (1: on a busy machine more threads mostly wait on each other)")
    parser.add_argument("--matrix-reps", type=int, default=2, help="pytest invocations per tree and target")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 repetitions, builtin_loop once each")
    parser.add_argument("--skip-matrix", action="store_true", help="only parts 0 and 1")
    parser.add_argument("--throughput-mb", type=int, default=1024, help="tensor size of part 0 (0: skip it)")
    args = parser.parse_args()
    targets: tuple[str, ...] = TARGETS
    reps, matrix_reps = args.reps, args.matrix_reps
    if args.quick:
        reps, matrix_reps, targets = 5, 1, ("builtin_loop",)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")

    if args.throughput_mb:
        print_throughput(throughput(args.throughput_mb), args.throughput_mb)
    r = state_cost(reps, args.steps, args.threads)
    print_state_cost(r, reps, args.steps)
    if not args.skip_matrix:
        m = matrix_wall(matrix_reps, targets)
        print_matrix(m, targets)


if __name__ == "__main__":
    main()
