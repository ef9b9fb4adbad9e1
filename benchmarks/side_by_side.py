"""What the two zero-change benchmarks share: running one unmodified training script under ``pytest
--resume-matrix`` and under ckpt-chaos 0.1.8, each returning the points it judged, how many it flagged (by
category) and its wall time. Not a benchmark itself; the scripts beside it import it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

CKPT_CHAOS = "ckpt-chaos==0.1.8"


def ckpt_chaos_executable(given: str | None, scratch: Path) -> str:
    """The ckpt-chaos executable given, else one installed into a virtual environment under ``scratch``."""
    if given:
        return given
    venv = scratch / "ckpt-chaos-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", CKPT_CHAOS], check=True)
    return str(venv / "bin" / "ckpt-chaos")


def print_rows(rows: list[tuple[str, str, dict]]) -> None:
    """The figures of each (variant, tool, result) a line, under a header; a result's note, if any, last."""
    first = max([len("variant"), *(len(v) for v, _, _ in rows)])
    second = max([len("tool"), *(len(t) for _, t, _ in rows)])
    print(f"{'variant':<{first}} {'tool':<{second}} {'points':>6} {'flagged':>7} {'wall s':>7} {'s/point':>7}  "
          "what was flagged")
    for variant, tool, r in rows:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items())) or "-"
        note = f" ({r['note']})" if r["note"] else ""
        print(f"{variant:<{first}} {tool:<{second}} {r['points']:>6} {r['flagged']:>7} {r['seconds']:>7.1f} "
              f"{r['seconds'] / max(1, r['points']):>7.2f}  {kinds}{note}")


def resume_check(script: Path, conftest: str, target: str, folder: Path,
                 env: dict[str, str] | None = None) -> tuple[dict, str]:
    """The default quick matrix (serial, seed 1) of a project holding ``script`` as ``train.py`` and
    ``conftest``; the figures, and pytest's output. ``env``: pytest's environment (default: this one's)."""
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(script.read_text())
    (folder / "conftest.py").write_text(conftest)
    (folder / "pytest.ini").write_text(f"[pytest]\nresume_matrix_targets = {target}\n")
    report = folder / "matrix.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--resume-matrix", "-q", "-p", "no:cacheprovider",
                           "--resume-matrix-seed=1", f"--resume-matrix-json={report}", f"--basetemp={folder / 'tmp'}"],
                          cwd=folder, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    cells = json.loads(report.read_text())["cells"]
    failing = [c for c in cells if not c["passed"]]
    kinds: dict[str, int] = {}
    for cell in failing:
        kinds[cell["categories"][0]] = kinds.get(cell["categories"][0], 0) + 1
    return {"points": len(cells), "flagged": len(failing), "kinds": kinds, "seconds": seconds, "note": ""}, done.stdout


def ckpt_chaos(executable: str, script: Path, flags: list[str], checkpoint_glob: str, folder: Path,
               options: tuple[str, ...] = ()) -> dict:
    """ckpt-chaos's contract mode on ``script`` (the closest to what the harness judges): its crash points and
    what it flagged, from its summary line. ``options``: more of ckpt-chaos's own (``--ranks 2``)."""
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(script.read_text())
    started = time.perf_counter()
    done = subprocess.run([executable, "run", "--checkpoint-glob", "{out}/" + checkpoint_glob, "--step-regex",
                           r"resumed from step (\d+)", "--result-file", "{out}/model.pt", "--fail-on",
                           "HARD_FAIL,SILENT_DIVERGENCE,LOST_WORK", *options, "--", sys.executable, "train.py", "--out",
                           "{out}",
                           *flags], cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    last = done.stdout.splitlines()[-1] if done.stdout.strip() else ""
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"\b([A-Z_]{4,}): (\d+)", last)}
    kinds = {k: n for k, n in counts.items() if k != "PASS"}
    return {"points": sum(counts.values()), "flagged": sum(kinds.values()), "kinds": kinds, "seconds": seconds,
            "note": "" if counts else f"no summary line: {done.stderr.strip()[-200:]}"}
