"""Wall time and cells per second of one resume matrix run three ways, side by side: serial on this machine,
with pytest-xdist ``-n 2``, and on a Ray cluster of two nodes on this machine through
``--resume-matrix-ray=ADDRESS`` (docs/cluster.md). Prints figures; exits non-zero only when the three ways do
not give every cell the same verdict (or a run breaks).

    python benchmarks/cluster_speed.py [--repeat 3] [--targets builtin_loop] [--seed 7] [--node-cpus 1]

Every way is one ``python -m pytest -p no:cacheprovider -q --resume-matrix`` of the bundled targets
``--targets`` (from the installed entry point) with one seed, in an empty temporary folder of its own (a
private TMPDIR inside it); ``serial`` adds nothing, ``-n 2`` adds ``-n 2``, ``ray`` adds
``--resume-matrix-ray=ADDRESS`` and gets the cluster's environment (its token, ``RAY_ADDRESS=""``). The
cluster (:class:`pytest_resume_check.cluster.testing.LocalCluster`, a head and a second raylet declaring
``--node-cpus`` CPUs each) is started once before the first run, and its start is timed and printed apart:
it is not part of any run's wall time. Each repetition runs the three ways in turn, the order rotated from
one repetition to the next so that the machine's noise falls on all alike.

Printed: each run's wall seconds (around the pytest subprocess: interpreter start, collection, the cells,
and for ``ray`` connecting to the cluster and starting the groups' pytest sessions on the nodes) and cells
(counted in its ``--resume-matrix-json`` file), whether every cell has the same ``status`` in every run,
then per way the median wall seconds, cells, cells per second and the median of the per-repetition ratios
of its cells per second to serial's (above 1: faster than serial), and the load average at the start and
the end.

On a 2-core machine the two "nodes" share the same two cores as ``-n 2`` does, so the ``ray`` way is not
expected to be faster than ``-n 2``: its gap to ``-n 2`` is the executor's overhead (connecting, scheduling
one task per group of cells, a pytest session per group on a node, the records sent back), not the speed-up
a cluster gives. On a real cluster each node brings its own cores, and the cells per second grow with the
nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_resume_check.cluster.testing import LocalCluster

WAYS = ("serial", "-n 2", "ray")
#: How long a pytest interrupted by Ctrl-C may take to stop its cells (and its Ray tasks) before it is killed.
STOP_WAIT = 150.0


def run(way: str, targets: list[str], seed: int, address: str, cluster_env: dict[str, str]
        ) -> tuple[float, dict[str, str], str]:
    """One pytest session: (wall seconds, each cell's status by name, pytest's last line)."""
    with tempfile.TemporaryDirectory(prefix="cluster-speed-") as tmp:
        folder = Path(tmp)
        (folder / "tmp").mkdir()
        report = folder / "matrix.json"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--resume-matrix",
                   *(f"--resume-matrix-target={t}" for t in targets), f"--resume-matrix-seed={seed}",
                   f"--resume-matrix-json={report}"]
        env = {**os.environ, "TMPDIR": str(folder / "tmp")}
        if way == "-n 2":
            command += ["-n", "2"]
        elif way == "ray":
            command.append(f"--resume-matrix-ray={address}")
            env.update({**cluster_env, "RAY_ADDRESS": ""})
        started = time.monotonic()
        with subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) as process:
            try:
                out, err = process.communicate()
            except KeyboardInterrupt:  # Ctrl-C reached pytest too: give it time to stop its cells and Ray tasks
                try:
                    process.communicate(timeout=STOP_WAIT)
                except subprocess.TimeoutExpired:
                    process.kill()
                raise
        seconds = time.monotonic() - started
        out, err = out.strip(), err.strip()
        last = out.splitlines()[-1] if out else err[-300:]
        if process.returncode not in (0, 1) or not report.exists():
            sys.exit(f"{way}: pytest ended with code {process.returncode} and {'a' if report.exists() else 'no'} "
                     f"JSON file:\n{out[-3000:]}\n{err[-3000:]}")
        cells = json.loads(report.read_text())["cells"]
    statuses = {f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]": c["status"] for c in cells}
    if len(statuses) != len(cells):
        sys.exit(f"{way}: {len(cells)} cells in the JSON file but {len(statuses)} distinct names")
    return seconds, statuses, last


def disagreements(runs: list[tuple[str, int, dict[str, str]]]) -> list[str]:
    """One line per cell whose status (or presence) is not the same in every run."""
    names = sorted(set().union(*(statuses for _, _, statuses in runs)))
    lines = []
    for name in names:
        seen = {statuses.get(name, "missing") for _, _, statuses in runs}
        if len(seen) > 1:
            lines.append(f"  {name}: " + ", ".join(f"{way} (rep {rep + 1}) {statuses.get(name, 'missing')}"
                                                    for way, rep, statuses in runs))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", default="builtin_loop", help="bundled targets, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="run each way this many times")
    parser.add_argument("--node-cpus", type=float, default=1.0, help="CPUs each of the two cluster nodes declares")
    args = parser.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    load_start = os.getloadavg()
    print(f"cores: {os.cpu_count()}; python {sys.version.split()[0]}; targets {', '.join(targets)}; "
          f"seed {args.seed}; {args.repeat} repetition(s)")
    cluster = LocalCluster([{"CPU": args.node_cpus}, {"CPU": args.node_cpus}])
    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    cells: dict[str, int] = {}
    runs: list[tuple[str, int, dict[str, str]]] = []
    try:
        started = time.monotonic()
        address = cluster.start()
        print(f"Ray cluster of 2 nodes ({args.node_cpus:g} CPU each) at {address}: started in "
              f"{time.monotonic() - started:.1f} s (not part of any run's wall time)")
        for rep in range(args.repeat):
            order = WAYS[rep % len(WAYS):] + WAYS[:rep % len(WAYS)]
            for way in order:
                seconds, statuses, last = run(way, targets, args.seed, address, cluster.env())
                walls[way].append(seconds)
                cells[way] = len(statuses)
                runs.append((way, rep, statuses))
                print(f"rep {rep + 1} {way:>6}: {seconds:6.1f} s wall, {len(statuses)} cells ({last})")
    finally:
        stopping = time.monotonic()
        cluster.stop()
        print(f"Ray cluster stopped in {time.monotonic() - stopping:.1f} s")
    load_end = os.getloadavg()

    differ = disagreements(runs)
    if differ:
        print(f"verdicts: {len(differ)} cell(s) do not have the same status in every run:")
        print("\n".join(differ))
    else:
        passed = sum(s == "PASSED" for s in runs[0][2].values())
        print(f"verdicts: all {len(runs)} runs agree: the same {len(runs[0][2])} cells, each with the same status "
              f"({passed} PASSED)")

    print(f"\nmedian of {args.repeat} run(s) per way:")
    print(f"  {'way':8s} {'wall s':>8s} {'cells':>6s} {'cells/s':>8s}  speed vs serial")
    for way in WAYS:
        ratio = statistics.median((cells[way] / w) / (cells["serial"] / s) for w, s in zip(walls[way], walls["serial"]))
        wall = statistics.median(walls[way])
        print(f"  {way:8s} {wall:8.1f} {cells[way]:6d} {cells[way] / wall:8.2f}  {ratio:5.2f}x")
    print("load average (1, 5, 15 min): " + ", ".join(f"{v:.2f}" for v in load_start) + " at the start; "
          + ", ".join(f"{v:.2f}" for v in load_end) + " at the end")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
