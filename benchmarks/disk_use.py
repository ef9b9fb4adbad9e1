"""Bytes a matrix session leaves on disk. Prints figures; asserts nothing.

    python benchmarks/disk_use.py [--steps 8] [--mb 20]

Runs a small torch-free target whose checkpoints hold ``--mb`` MB each through
``pytest --resume-matrix`` twice, each session with its own ``--basetemp``: once all green, once with a
case whose resume loses an input (its failing cells must keep what reproduces them). For each it
prints the bytes left under the session's folder and the peak seen while the session ran (polled).
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
    STEPS = {steps}

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
            if run.should_checkpoint(step):
                folder = run.checkpoint_dir / f"s{{step}}"
                folder.mkdir(exist_ok=True)
                (folder / "weights.bin").write_bytes(b"w" * {size})
                (folder / "step").write_text(str(step))
                latest.write_text(str(step))
                run.checkpoint_published(step, folder)
''')


def size_of(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


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
               "resume_matrix", f"--basetemp={base}"]
    proc = subprocess.Popen(command, cwd=project, env={**os.environ, "PYTHONPATH": str(project)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, size_of(base))
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    kept = size_of(base / "resume-matrix0")
    print(f"{label:<16} checkpoints {ARGS.mb} MB, {ARGS.steps} steps: kept {kept / 1e6:8.1f} MB after the session, "
          f"peak {peak / 1e6:8.1f} MB while it ran  | {summary}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        session(Path(tmp), "[{'id': 'ok'}]", "all green")
        session(Path(tmp), "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]", "one failing case")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mb", type=int, default=20)
    ARGS = parser.parse_args()
    main()
