"""Serial against ``-n 2``: a user's project of about 30 cells, one of about 100, and the bundled
default quick matrix (the main job). Prints figures; asserts nothing.

    python benchmarks/xdist_speed.py [--reps 2] [--seed 1234] [--only small,medium,main] [--target NAME ...]

The user's projects are a plain PyTorch loop declared the obvious way (the conftest of
``benchmarks/untuned_cost.py``: torch imported at the top, no ``preload``, default crash smoke cells),
with 2 cases (31 cells) and 6 cases (87 cells); its ``latest`` pointer is made durable (fsync) so the
smoke cells pass. The main job is ``pytest --resume-matrix -m
resume_matrix`` from this checkout (its ``tests/conftest.py`` declares the bundled targets; ``--target``
narrows it). Each is run without xdist (``-p no:xdist``), with ``-n 2`` (each worker its own fork server, as before
``--resume-matrix-server``) and with ``-n 2 --resume-matrix-server=on`` (the workers share one server, started
cold: each invocation has a private TMPDIR, and the server ends 1 s after it) per repetition, in an order that
rotates, with one seed. Prints each
invocation's wall and CPU seconds (its own and its children's; the shared server's are not among them) and
cells, the load, and the median of the per-repetition ratios serial / each ``-n 2`` variant (the goals on two
cores: at least 1.3 at 30 cells, 1.6 at 100).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "benchmarks"))
from untuned_cost import CONFTEST  # noqa: E402  (the plain torch loop, declared as a user would)

from pytest_resume_check.records.names import SERVER_IDLE_ENV  # noqa: E402

#: The user's projects: name -> cases of the plain loop (each case 14 cells, plus the first case's smoke cells).
PROJECTS = {"small": 2, "medium": 6}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str], seed: int, cwd: Path, extra: list[str]) -> tuple[float, float, int, str]:
    """One pytest invocation: (wall seconds, CPU seconds, cells, last line)."""
    with tempfile.TemporaryDirectory(prefix="xdist-speed-") as tmp:
        command = [sys.executable, "-m", "pytest", "--resume-matrix", "-m", "resume_matrix", "-q",
                   "-p", "no:cacheprovider", f"--resume-matrix-seed={seed}", *extra, *args]
        started, cpu = time.monotonic(), children_cpu()
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(cwd), SERVER_IDLE_ENV: "1"})
        seconds, cpu = time.monotonic() - started, children_cpu() - cpu
    found = re.search(r"resume matrix: (\d+) cells", done.stdout)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    return seconds, cpu, int(found.group(1)) if found else 0, last


def user_project(root: Path, name: str, cases: int) -> Path:
    """The plain loop with ``cases`` cases, as one target ``loop`` (no preload, default smoke cells)."""
    path = root / name
    path.mkdir()
    ids = [{"id": f"c{i}"} for i in range(cases)]
    pointer = '            (run.checkpoint_dir / "latest.tmp").write_text(folder.name)\n'
    durable = ('            with open(run.checkpoint_dir / "latest.tmp", "w") as f:\n'
               '                f.write(folder.name)\n'
               '                f.flush()\n'
               '                os.fsync(f.fileno())\n')
    assert pointer in CONFTEST
    (path / "conftest.py").write_text(CONFTEST.replace(pointer, durable).split("CASES = ")[0] + f"""
CASES = {ids!r}
loop = resume_target(train, name="loop", steps=STEPS, cases=CASES,
                     boundaries=lambda case: [PER_EPOCH * e for e in range(1, EPOCHS + 1)])
""")
    (path / "pytest.ini").write_text("[pytest]\nresume_matrix_targets = loop\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--only", default="small,medium,main", help="which matrices, comma-separated")
    parser.add_argument("--target", action="append", default=[], help="the main job: only these bundled targets")
    options = parser.parse_args()
    modes = {"serial": ["-p", "no:xdist"], "-n 2": ["-n", "2"], "-n 2 shared": ["-n", "2", "--resume-matrix-server=on"]}
    print(f"cores: {os.cpu_count()}; seed {options.seed}; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="xdist-projects-") as tmp:
        matrices = {name: (user_project(Path(tmp), name, cases), []) for name, cases in PROJECTS.items()}
        matrices["main"] = (HERE, [f"--resume-matrix-target={t}" for t in options.target])
        for name in options.only.split(","):
            cwd, extra = matrices[name]
            ratios: dict[str, list[float]] = {mode: [] for mode in modes if mode != "serial"}
            for rep in range(options.reps):
                order = list(modes)[rep % len(modes):] + list(modes)[:rep % len(modes)]
                times = {}
                for mode in order:
                    seconds, cpu, cells, last = run(modes[mode], options.seed, cwd, extra)
                    times[mode] = seconds
                    print(f"{name} rep {rep + 1} {mode:>11}: {seconds:6.1f} s wall, {cpu:6.1f} s CPU, {cells} cells "
                          f"({last})")
                for mode in ratios:
                    ratios[mode].append(times["serial"] / times[mode])
            for mode, values in ratios.items():
                print(f"{name}: serial / {mode}: median {statistics.median(values):.2f}x over {len(values)} "
                      f"repetitions ({', '.join(f'{r:.2f}' for r in values)}); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
