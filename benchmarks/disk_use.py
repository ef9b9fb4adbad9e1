"""Bytes a matrix session leaves on disk. Prints figures; asserts nothing.

    python benchmarks/disk_use.py [--steps 8] [--mb 20] [--mode full]

Runs a small torch-free target whose checkpoints hold ``--mb`` MB each through
``pytest --resume-matrix`` twice, each session with its own ``--basetemp``: once all green, once with a
case whose resume loses an input (its failing cells must keep what reproduces them). For each it
prints the bytes left under the session's folder and the peak seen while the session ran (polled; a file
linked twice counts once, as the disk holds it), against one run's checkpoints (steps x MB): the shared
first run's snapshots must stay within a small multiple of that, not grow with its square.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRAINER = textwrap.dedent('''
    import os
    import shutil

    STEPS = {steps}


    def write(path, data):  # durable: what a power cut keeps is what was fsynced
        with open(path, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())


    def fsync_folder(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


    def train(run):
        latest = run.checkpoint_dir / "latest"
        start = 0
        if run.resume_mode == "path":
            start = int((run.resume_path / "step").read_text())
        elif run.resume_mode == "auto" and latest.exists():
            start = int(latest.read_text())
        run.resumed(start, run.checkpoint_dir / f"s{{start}}" if start else None)
        skip = start + 1 if start and run.case.get("skip") else None
        for step in range(start + 1, STEPS + 1):
            if step != skip:
                run.consumed([step], step=step, epoch=0)
            run.step_end(step)
            if run.should_checkpoint(step):  # written aside, then renamed: a kill mid-save leaves no half
                folder, scratch = run.checkpoint_dir / f"s{{step}}", run.checkpoint_dir / f"s{{step}}.tmp"
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir()
                write(scratch / "weights.bin", b"w" * {size})
                write(scratch / "step", str(step).encode())
                fsync_folder(scratch)
                os.replace(scratch, folder)
                write(run.checkpoint_dir / "latest.tmp", str(step).encode())
                os.replace(run.checkpoint_dir / "latest.tmp", latest)
                fsync_folder(run.checkpoint_dir)
                run.checkpoint_published(step, folder)
''')


def size_of(path: Path) -> int:
    sizes = {}
    for root, _, names in os.walk(path):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            sizes[(info.st_dev, info.st_ino)] = info.st_size
    return sum(sizes.values())


def session(workdir: Path, cases: str, label: str) -> None:
    project = workdir / label
    project.mkdir()
    base = workdir / f"{label}-basetemp"
    (project / "disk_trainer.py").write_text(TRAINER.format(steps=ARGS.steps, size=ARGS.mb * 1_000_000))
    (project / "conftest.py").write_text(
        "import disk_trainer\nfrom pytest_resume_check import resume_target\n"
        f"t = resume_target(disk_trainer.train, name='disk', steps=disk_trainer.STEPS, cases={cases},"
        " preload=('disk_trainer',))\n")
    (project / "pytest.ini").write_text("[pytest]\nresume_matrix_targets = disk\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--resume-matrix", "-m",
               "resume_matrix", f"--basetemp={base}", f"--resume-matrix-mode={ARGS.mode}"]
    log = workdir / f"{label}.log"  # a file, not a pipe: a long report would fill the pipe and stop pytest
    with open(log, "w") as output:
        proc = subprocess.Popen(command, cwd=project, env={**os.environ, "PYTHONPATH": str(project)},
                                stdout=output, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, size_of(base))
            time.sleep(0.05)
    out = log.read_text()
    summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    kept = size_of(base / "resume-matrix0")
    one_run = ARGS.steps * ARGS.mb
    print(f"{label:<16} checkpoints {ARGS.mb} MB, {ARGS.steps} steps ({one_run} MB a run): kept {kept / 1e6:8.1f} MB "
          f"after the session, peak {peak / 1e6:8.1f} MB while it ran ({peak / 1e6 / one_run:.1f}x a run)  | {summary}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        session(Path(tmp), "[{'id': 'ok'}]", "all green")
        session(Path(tmp), "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]", "one failing case")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--mode", default="full", help="matrix mode (full: a kill after every step)")
    ARGS = parser.parse_args()
    main()
