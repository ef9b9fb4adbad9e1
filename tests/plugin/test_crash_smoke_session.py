"""Crash smoke cells in a user's session: a project whose target declares nothing about
crash consistency and saves in place, without fsync, fails a few crash cells of its default matrix;
``crash_save=False`` leaves them out. A project of its own in a temporary folder, ``pytest`` run in a
subprocess; the trainer is the torch-free one of ``tests/support/project_trainer.py``, whose checkpoint
files (``weights.bin``, ``step`` and the ``latest`` pointer) are written in place.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from pytest_resume_check import categories

TRAINER = Path(__file__).resolve().parents[1] / "support" / "project_trainer.py"
#: The save of step 2: mkdir s2; open, write, close s2/weights.bin, s2/step and latest (ops 1-9).
SMOKE = ["files[ok-auto-save2op9]", "files[ok-auto-save2op9:power]", "files[ok-auto-save2op10:power]",
         "files[ok-auto-save2op10:torn:latest]"]


def project(path: Path, options: str = "") -> Path:
    """A project whose conftest declares the torch-free trainer with one case (``options`` added)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "project_trainer.py").write_text(TRAINER.read_text())
    (path / "conftest.py").write_text(
        "import project_trainer\nfrom pytest_resume_check import resume_target\n"
        "t = resume_target(project_trainer.train, name='files', steps=project_trainer.STEPS, cases=[{'id': 'ok'}], "
        f"preload=('project_trainer',){options})\n")
    return path


def pytest_in(path: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
                          cwd=path, env={**os.environ, "PYTHONPATH": str(path), "COLUMNS": "120"},
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_a_save_written_in_place_fails_the_default_smoke_cells_and_nothing_else(tmp_path):
    report = tmp_path / "cells.json"
    code, out = pytest_in(project(tmp_path / "p"), "--resume-matrix", "-p", "no:xdist",
                          f"--resume-matrix-json={report}")
    assert code == 1, out[-3000:]
    cells = json.loads(report.read_text())["cells"]
    failed = sorted(f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]" for c in cells if not c["passed"])
    assert failed == sorted(SMOKE), out[-3000:]
    assert {cat for c in cells if not c["passed"] for cat in c["categories"]} == {categories.RESUME_ERROR}
    assert sorted(re.findall(r"^FAILED resume-matrix::(\S+)", out, re.M)) == sorted(SMOKE)
    assert "files: 4 crash-consistency cells of the save of step 2 (case ok)" in out
    assert f"{len(cells) - 4} passed" in out.splitlines()[-1]


def test_cells_killed_after_a_checkpoint_still_share_their_first_run_beside_smoke_cells(tmp_path):
    """Recording the save for the smoke cells made the engine while collecting, and it kept the empty cell
    list of that moment: every cell then ran a first run of its own (found by the disk
    benchmark). Each run leaves a file when it starts; a group's cells killed right after a checkpoint
    (``ckptN``) must have started one first run between them."""
    report, flags = tmp_path / "cells.json", tmp_path / "flags"
    flags.mkdir()
    path = project(tmp_path / "p")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
               f"--resume-matrix-json={report}"]
    done = subprocess.run(command, cwd=path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(path), "TRAINER_FLAG_DIR": str(flags)})
    cells = json.loads(report.read_text())["cells"]
    assert len(cells) > 8, done.stdout[-2000:]
    single = [c for c in cells if re.fullmatch(r"ckpt\d+", c["kill"])]
    groups = {c["resume_mode"] for c in single}
    assert len(single) > len(groups) >= 1
    listed = sum(len(c["runs"]) for c in cells)  # a shared first run is listed by each of its cells
    references, recorded_saves = 2, 1  # one uninterrupted run per resume mode; the save of step 2
    started = len(list(flags.iterdir()))
    assert started == listed + references + recorded_saves - (len(single) - len(groups)), done.stdout[-2000:]


def test_the_rerun_line_of_a_failing_smoke_cell_runs_that_cell_alone(tmp_path):
    path = project(tmp_path / "p")
    code, out = pytest_in(path, "--resume-matrix", "-p", "no:xdist", "-k", "save2op10")
    rerun = next(shlex.split(line.strip().removeprefix("rerun: pytest ")) for line in out.splitlines()
                 if line.strip().startswith("rerun: ") and "save2op10:power" in line)
    code, out = pytest_in(path, *rerun, "-p", "no:xdist")
    assert code == 1, out[-3000:]
    assert re.findall(r"^FAILED resume-matrix::(\S+)", out, re.M) == ["files[ok-auto-save2op10:power]"]
    assert "resume matrix: 1 cells, 1 failing" in out


def test_crash_save_false_turns_the_smoke_cells_off(tmp_path):
    path = project(tmp_path / "p", ", crash_save=False")
    code, out = pytest_in(path, "--resume-matrix", "-p", "no:xdist")
    assert code == 0, out[-3000:]
    assert "save2" not in out and "crash-consistency" not in out
    code, out = pytest_in(path, "--resume-matrix", "--co", "-q")
    assert code == 0 and "crash-consistency cells not listed" not in out, out[-3000:]


def test_collect_only_says_the_smoke_cells_are_not_listed_and_runs_nothing(tmp_path):
    code, out = pytest_in(project(tmp_path / "p"), "--resume-matrix", "--co", "-q")
    assert code == 0, out[-3000:]
    assert "resume-check: files: crash-consistency cells not listed" in out
    assert "save2" not in out


def test_a_rerun_of_a_cell_killed_after_a_checkpoint_records_no_save(tmp_path):
    """Naming only cells that are not crash cells (a rerun line, a group of cells on a cluster node) skips
    recording the save the crash cells need: that run would train once for nothing. Naming a crash cell
    still records it. Each run leaves a file when it starts: the reference's two runs, the cell's runs,
    and the recording run if there is one."""
    path = project(tmp_path / "p")
    for name, recorded in (("files[ok-auto-ckpt1]", 0), ("files[ok-auto-save2op9:power]", 1)):
        flags, report = tmp_path / f"flags-{recorded}", tmp_path / f"cells-{recorded}.json"
        flags.mkdir()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "--resume-matrix", "--resume-matrix-seed=1", f"--resume-matrix-cell={name}",
                               f"--resume-matrix-json={report}"], cwd=path, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONPATH": str(path), "TRAINER_FLAG_DIR": str(flags)})
        [cell] = json.loads(report.read_text())["cells"]
        assert len(list(flags.iterdir())) == 2 + len(cell["runs"]) + recorded, done.stdout[-3000:]


def test_two_xdist_workers_record_each_save_once_and_make_the_same_smoke_cells(tmp_path):
    """Each worker collects the whole matrix; the save a target's smoke cells come from is recorded by one
    of them and read by the other (kept beside the workers' own folders), not recorded by each."""
    path = project(tmp_path / "p")
    conftest = path / "conftest.py"
    conftest.write_text(conftest.read_text() + "t2 = t.with_options(name='files2')\n")
    report, flags = tmp_path / "cells.json", tmp_path / "flags"
    flags.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--resume-matrix", "-n", "2",
                           f"--resume-matrix-json={report}"], cwd=path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(path), "TRAINER_FLAG_DIR": str(flags)})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    recorded = sorted(f.read_text().split()[0] for f in flags.glob("started-*-record-save2"))
    assert recorded == ["files", "files2"], out[-3000:]
    cells = json.loads(report.read_text())["cells"]
    failed = sorted(f"{c['target']}[{c['case_id']}-{c['resume_mode']}-{c['kill']}]" for c in cells if not c["passed"])
    assert failed == sorted([*SMOKE, *(name.replace("files[", "files2[") for name in SMOKE)]), out[-3000:]
