"""Cost of large checkpoints in a matrix session, this checkout beside another. Prints figures; asserts nothing.

    python benchmarks/large_state.py [--mb 512] [--steps 12] [--keep 2] [--reps 2] [--against DIR] [--where DIR]

Runs a small torch-free target whose checkpoints hold ``--mb`` MB of model state (one file a checkpoint,
written aside and renamed into a folder of its own, the oldest folders removed past ``--keep``, as a trainer
that keeps its last checkpoints does) through ``pytest --resume-matrix`` (the default quick matrix, serial),
each session with its own ``--basetemp`` under ``--where`` (a folder on the file system to measure: the
kernel decides whether a reflink is possible there). ``--against DIR`` runs the same session with the package
imported from another checkout (a ``git worktree`` of an older commit), the two interleaved in each
repetition. For each it prints the wall time, the CPU of pytest and everything it started (user and system
apart, from the rusage of the waited children), the peak disk use while it ran (polled; a file linked twice
counts once, as the disk holds it) and what it left, and the session's summary line; then the medians and
their ratio. ``--in-place`` makes the trainer rewrite one checkpoint file in place instead (every snapshot
then has to be copied: the safe path).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

TRAINER = textwrap.dedent('''
    import os
    import shutil

    STEPS = {steps}
    KEEP = {keep}
    IN_PLACE = {in_place}
    BLOCK = b"w" * (1 << 20)


    def save(path, step):  # the model state: {mb} MB, its last block naming the step
        with open(path, "r+b" if IN_PLACE and os.path.exists(path) else "wb") as out:
            for _ in range({mb} - 1):
                out.write(BLOCK)
            out.write(str(step).encode().ljust(1 << 20))


    def train(run):
        latest = run.checkpoint_dir / "latest"
        start = 0
        if run.resume_mode == "path":
            start = int((run.resume_path / "step").read_text())
        elif run.resume_mode == "auto" and latest.exists():
            start = int(latest.read_text())
        if start:
            folder = run.resume_path or run.checkpoint_dir / ("current" if IN_PLACE else f"s{{start}}")
            with open(folder / "model.bin", "rb") as state:
                state.seek(({mb} - 1) << 20)
                assert int(state.read().strip()) == start, "restored state of another step"
        run.resumed(start, run.checkpoint_dir / f"s{{start}}" if start else None)
        for step in range(start + 1, STEPS + 1):
            run.consumed([step], step=step, epoch=0)
            run.step_end(step)
            if run.should_checkpoint(step):
                name = "current" if IN_PLACE else f"s{{step}}"
                folder, scratch = run.checkpoint_dir / name, run.checkpoint_dir / f"{{name}}.tmp"
                if IN_PLACE:
                    folder.mkdir(exist_ok=True)
                    save(folder / "model.bin", step)
                    (folder / "step").write_text(str(step))
                else:
                    shutil.rmtree(scratch, ignore_errors=True)
                    scratch.mkdir()
                    save(scratch / "model.bin", step)
                    (scratch / "step").write_text(str(step))
                    os.replace(scratch, folder)
                (run.checkpoint_dir / "latest.tmp").write_text(str(step))
                os.replace(run.checkpoint_dir / "latest.tmp", latest)
                run.checkpoint_published(step, folder)
                if not IN_PLACE:
                    for old in range(1, step - KEEP + 1):
                        shutil.rmtree(run.checkpoint_dir / f"s{{old}}", ignore_errors=True)
''')


def size_of(path: Path) -> int:
    sizes = {}
    for root, _, names in os.walk(path):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            sizes[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(sizes.values())


def session(project: Path, source: Path, base: Path) -> dict[str, object]:
    cells = base.parent / "cells.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
               "-m", "resume_matrix", f"--basetemp={base}", "--resume-matrix-seed=1", f"--resume-matrix-json={cells}"]
    base.parent.mkdir(parents=True, exist_ok=True)
    log = base.parent / f"{base.name}.log"  # a file, not a pipe: a long report would fill the pipe and stop pytest
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(log, "w") as output:
        proc = subprocess.Popen(command, cwd=project, stdout=output, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{source}"})
        peak = 0
        while proc.poll() is None:
            peak = max(peak, size_of(base))
            time.sleep(0.2)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = log.read_text()
    kept = size_of(base)
    shutil.rmtree(base, ignore_errors=True)
    try:
        found = json.loads(cells.read_text())["cells"]
        # paths in a headline name this session's folder: made the same for the comparison
        verdicts = {c["rerun"]: (c["status"], c["categories"], c["headline"].replace(str(base), "<basetemp>"))
                    for c in found}
    except (OSError, ValueError, KeyError):
        verdicts = {}
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "system": after.ru_stime - before.ru_stime,
            "peak": peak, "kept": kept, "summary": out.strip().splitlines()[-1] if out.strip() else "(no output)",
            "verdicts": verdicts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="MB of model state in each checkpoint")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--keep", type=int, default=2, help="checkpoint folders the trainer keeps")
    parser.add_argument("--in-place", action="store_true", help="one checkpoint file, rewritten in place")
    parser.add_argument("--reps", type=int, default=2, help="sessions per checkout, interleaved")
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run beside this one")
    parser.add_argument("--where", type=Path, default=None, help="folder to measure in (default: the temp folder)")
    args = parser.parse_args()
    trees = {"new": HERE, **({"old": args.against.resolve()} if args.against else {})}
    with tempfile.TemporaryDirectory(prefix="large-state-", dir=args.where) as tmp:
        work = Path(tmp)
        fs = subprocess.run(["df", "-T", str(work)], capture_output=True, text=True).stdout.splitlines()[-1].split()
        print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; measured in {work} ({fs[1]}, "
              f"{int(fs[4]) // (1 << 20)} GB free); checkpoints {args.mb} MB, {args.steps} steps, "
              f"{'one file rewritten in place' if args.in_place else f'last {args.keep} kept'}")
        project = work / "project"
        project.mkdir()
        (project / "big_trainer.py").write_text(TRAINER.format(steps=args.steps, mb=args.mb, keep=args.keep,
                                                               in_place=args.in_place))
        (project / "conftest.py").write_text(
            "import big_trainer\nfrom pytest_resume_check import resume_target\n"
            "t = resume_target(big_trainer.train, name='big', steps=big_trainer.STEPS, preload=('big_trainer',),"
            " crash_save=False)\n")
        (project / "pytest.ini").write_text("[pytest]\nresume_matrix_targets = big\n")
        rows: dict[str, list[dict[str, object]]] = {label: [] for label in trees}
        for rep in range(args.reps):
            for label, tree in (trees.items() if rep % 2 == 0 else reversed(trees.items())):
                row = session(project, tree, work / f"{label}{rep}" / "basetemp")
                rows[label].append(row)
                print(f"  {label} #{rep + 1}: {row['wall']:6.1f} s wall, user {row['user']:5.1f} s, system "
                      f"{row['system']:5.1f} s, peak {row['peak'] / 1e9:5.2f} GB, left {row['kept'] / 1e9:5.2f} GB"
                      f"  | {row['summary']}", flush=True)
        med = {label: {key: statistics.median(float(r[key]) for r in rs) for key in ("wall", "user", "system", "peak")}
               for label, rs in rows.items()}
        print("\nmedians")
        for label, m in med.items():
            print(f"  {label}: {m['wall']:6.1f} s wall, user {m['user']:5.1f} s, system {m['system']:5.1f} s, "
                  f"peak {m['peak'] / 1e9:5.2f} GB ({m['peak'] / 1e6 / (args.steps * args.mb):.1f}x a run's "
                  f"checkpoints)")
        if "old" in med:
            print(f"  old / new: wall {med['old']['wall'] / med['new']['wall']:.2f}x, system "
                  f"{med['old']['system'] / max(med['new']['system'], 1e-9):.2f}x")
            new, old = rows["new"][0]["verdicts"], rows["old"][0]["verdicts"]
            assert isinstance(new, dict) and isinstance(old, dict)
            differ = [k for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)]
            print(f"  verdicts (status, categories, headline by rerun line): {len(new)} cells new, {len(old)} old, "
                  f"{len(differ)} differing" + "".join(f"\n    {k}: new {new.get(k)}, old {old.get(k)}"
                                                       for k in differ))


if __name__ == "__main__":
    main()
