"""Verdicts must not depend on the load: run two-rank matrices on an idle machine and beside CPU
burners, side by side in one run, and compare every cell's JSON.

The targets: the bundled ``ddp_loop`` (DDP, StatefulDistributedSampler, DCP; saves on SIGTERM) and the
two-rank loop that once failed ``LOST 1 input on rank 1`` under load (consumed, all-reduce, step_end,
save on rank 0, barrier; ``tests/support/trust_targets.py:two_rank_loop``). For each repetition, each target's
matrix runs once without and once with ``--burners`` processes spinning (``python3 -c "while True:
pass"``), with the same seed; a cell differs when its status, categories, headline or composite ledger
differ. Prints the figures and exits 1 if any cell differs (``tests/engine/test_trust_under_load.py`` runs it
once in CI)::

    python benchmarks/load_verdicts.py --runs 3 --burners 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A project whose conftest declares that two-rank loop (the trainer lives in the repository's tests/).
ISSUE_LOOP_CONFTEST = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(ROOT / "tests" / "support")!r})
    import trust_targets
    from pytest_resume_check import resume_target

    issue_loop = resume_target(steps=trust_targets.STEPS, world_size=2, name="issue_loop",
                               preload=("torch", "torch.distributed"))(trust_targets.two_rank_loop)
""")


@contextmanager
def burning(n: int):
    """``n`` processes that spin a core each while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_matrix(cwd: Path, target: str, seed: int, out: Path, workers: int) -> tuple[dict[str, dict], float]:
    """Every cell's JSON by name, and the wall time."""
    args = [sys.executable, "-m", "pytest", "--resume-matrix", "-m", "resume_matrix",
            f"--resume-matrix-target={target}", f"--resume-matrix-seed={seed}", f"--resume-matrix-json={out}",
            "-p", "no:cacheprovider", "-q",
            f"--basetemp={out.parent / (out.stem + '-bt')}"]
    if workers > 1:
        args += ["-n", str(workers)]
    started = time.monotonic()
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    seconds = time.monotonic() - started
    if not out.exists():
        raise SystemExit(f"{target}: no JSON written (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
                         f"{done.stderr[-2000:]}")
    cells = json.loads(out.read_text())["cells"]
    if not cells:  # nothing compared is no evidence
        raise SystemExit(f"{target}: the matrix ran no cell (exit {done.returncode}):\n{done.stdout[-3000:]}")
    return {f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]": c for c in cells}, seconds


def verdict(cell: dict) -> tuple:
    """What must not depend on the load."""
    return (cell["status"], tuple(cell["categories"]), cell["headline"], json.dumps(cell["composite"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions (each: idle, then beside the burners)")
    parser.add_argument("--burners", type=int, default=2, help="CPU burners during the loaded runs")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of each matrix run")
    parser.add_argument("--targets", default="ddp_loop,issue_loop", help="comma-separated targets")
    options = parser.parse_args(argv)
    differing_total = 0
    with tempfile.TemporaryDirectory(prefix="load-verdicts-") as tmp:
        project = Path(tmp) / "issue_loop_project"
        project.mkdir()
        (project / "conftest.py").write_text(ISSUE_LOOP_CONFTEST)
        print(f"two-rank verdicts idle and beside {options.burners} CPU burners, seed {options.seed} "
              f"(python {sys.version.split()[0]}, {os.cpu_count()} cores):")
        print(f"  {'run':>3}  {'target':<12} {'cells':>5}  {'idle':>8}  {'loaded':>8}  {'differing':>9}")
        for run in range(1, options.runs + 1):
            for target in options.targets.split(","):
                # A project of its own for both: the bundled ddp_loop runs there when named, and in this
                # repository's root every process of a matrix run would also collect the suite's test modules.
                cwd = project
                idle, idle_s = run_matrix(cwd, target, options.seed, Path(tmp) / f"{target}-{run}-idle.json",
                                          options.workers)
                with burning(options.burners):
                    loaded, loaded_s = run_matrix(cwd, target, options.seed, Path(tmp) / f"{target}-{run}-loaded.json",
                                                  options.workers)
                names = sorted(set(idle) | set(loaded))
                differing = [n for n in names
                             if n not in idle or n not in loaded or verdict(idle[n]) != verdict(loaded[n])]
                differing_total += len(differing)
                print(f"  {run:>3}  {target:<12} {len(names):>5}  {idle_s:>7.1f}s  {loaded_s:>7.1f}s  "
                      f"{len(differing):>9}")
                for name in differing:
                    print(f"       {name}: idle {idle.get(name, {}).get('headline', '(missing)')!r}, "
                          f"loaded {loaded.get(name, {}).get('headline', '(missing)')!r}")
    print(f"differing cells in all: {differing_total}")
    return 1 if differing_total else 0


if __name__ == "__main__":
    sys.exit(main())
