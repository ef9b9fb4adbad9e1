"""Reports that tell the whole truth, through the public API: a project of its own with
planted targets, run by ``pytest --resume-matrix`` in a subprocess. Each test checks the words a user
reads (headline, kept log, counts, warnings), not only pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

CONFTEST = '''
from pytest_resume_check import resume_target
from pytest_resume_check.builtin import loop

import helpers

PRELOAD = ("torch", "torchdata.stateful_dataloader")
E3 = {"id": "e3", "n": 12, "batch": 4, "take": 4, "epochs": 3}  # 9 steps, epochs end at steps 3, 6 and 9
TAKE2 = {"id": "take2", "n": 8, "batch": 4, "take": 2}


def target(fn, name, cases, **options):
    return resume_target(fn, name=name, steps=loop.total_steps, boundaries=loop.epoch_boundaries, cases=cases,
                         preload=options.pop("preload", PRELOAD), **options)


# Path resume only, with verl's "the step count says the epoch is over" heuristic.
path_boundary = target(loop.loop_restart_at_epoch_boundary, "path_boundary", [E3], resume_modes=("path",))
# Logs a line at every resume, then drops its buffered tail.
logging_bug = target(helpers.logging_drop_buffer, "logging_bug", [TAKE2], resume_modes=("auto",))
# Declares an expected failure for a cell that passes: an XPASS.
stale_xfail = target(loop.correct_loop, "stale_xfail", [TAKE2], resume_modes=("auto",),
                     expected_failures=[(lambda cell: cell.kill_id == "ckpt2", "a bug fixed long ago")])
# A warm-up whose module the fork server cannot import (a typo, or a folder not on sys.path).
missing_helper = target(loop.correct_loop, "missing_helper", [TAKE2], resume_modes=("auto",),
                        preload=(*PRELOAD, "helpres:warm_up"))
# A warm-up that trains one step with a matrix big enough for torch's thread pool.
threaded_torch = target(loop.correct_loop, "threaded_torch", [TAKE2], resume_modes=("auto",),
                        preload=(*PRELOAD, "helpers:torch_step"))
# A warm-up that leaves a thread of its own running.
leaves_thread = target(loop.correct_loop, "leaves_thread", [TAKE2], resume_modes=("auto",),
                       preload=(*PRELOAD, "helpers:start_thread"))
'''

HELPERS = '''
import threading
import time

from pytest_resume_check.builtin import loop

LINE = "helpers: resuming, buffer as saved"


def logging_drop_buffer(run):
    if run.is_resume:
        run.log(LINE)
    print("helpers: stdout of the trainer", flush=True)
    loop.train(run, loop.DROP_BUFFER)


def torch_step():
    import torch

    a = torch.randn(512, 512)
    model = torch.nn.Linear(512, 1)
    model(a @ a).pow(2).mean().backward()


def start_thread():
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("truth")
    (folder / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (folder / "helpers.py").write_text(textwrap.dedent(HELPERS))
    return folder


def matrix(project: Path, target: str, *args: str) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--resume-matrix",
               "-m", "resume_matrix", "--resume-matrix-seed=5", f"--resume-matrix-target={target}",
               f"--basetemp={project / ('bt-' + target)}", "-rA", *args]
    done = subprocess.run(command, cwd=project, env={**os.environ, "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_quick_path_mode_kills_at_every_epoch_boundary(project):
    """Item 1: a path-only target with an epoch-boundary bug passed all 6 quick cells; the quick
    path cells now include each boundary and one unsaved step after it."""
    code, out = matrix(project, "path_boundary")
    assert code == 1, out[-3000:]
    failed = set(re.findall(r"^FAILED resume-matrix::path_boundary\[e3-path-([^\]]+)\]", out, re.M))
    assert {"ckpt3", "ckpt6", "ckpt3+1", "ckpt6+1"} <= failed, out[-3000:]
    assert "ckpt1" not in failed, out[-5000:]  # away from a boundary the heuristic is right


def test_run_log_lines_and_output_are_in_the_log_file_the_report_and_the_json(project, tmp_path):
    """Item 4: run.log lines went nowhere; now they are in the run's log file, the failure report quotes
    each run's last run.log lines, and the JSON carries the last lines of each run's whole log."""
    report = tmp_path / "cells.json"
    code, out = matrix(project, "logging_bug", f"--resume-matrix-json={report}", "-k", "auto-ckpt1]")
    assert code == 1, out[-3000:]
    assert "LOST 2 inputs after resume from step_1" in out
    line = "[run.log] helpers: resuming, buffer as saved"
    kept = Path(re.search(r"kept: (\S+)", out).group(1))
    assert line in (kept / "run1.log").read_text()
    assert re.search(rf"log of run 2 \(last lines of {re.escape(str(kept / 'run1.log'))}\):\n(    .*\n)*"
                     rf"    {re.escape(line)}", out), out[-3000:]
    # The trainer's other output stays in the file and the JSON: in the report it would bury the log lines
    # (a run that raised, crashed or hung gets its last output lines of any kind quoted).
    assert "helpers: stdout of the trainer" in (kept / "run0.log").read_text()
    assert "    helpers: stdout of the trainer" not in out
    [cell] = json.loads(report.read_text())["cells"]
    runs = cell["runs"]
    assert runs[1]["log_file"] == str(kept / "run1.log") and line in runs[1]["log_tail"]
    assert line not in runs[0]["log_tail"] and "helpers: stdout of the trainer" in runs[0]["log_tail"]


def test_an_expected_failure_that_passes_counts_as_failing_with_its_rerun_line(project):
    """Item 5: an XPASS was counted as '0 failing, 1 expected failures' while pytest said '1 failed'."""
    code, out = matrix(project, "stale_xfail")
    assert code == 1, out[-3000:]
    assert re.search(r"resume matrix: \d+ cells, 1 failing, 0 expected failures", out), out[-3000:]
    assert "1 failed" in out
    smallest = out.split("smallest failing kill point of each failing case:")[1]
    assert re.search(r"stale_xfail\[take2-auto-ckpt2\]: XPASS: declared as an expected failure \(a bug fixed long "
                     r"ago\) but passed.*\n    rerun: pytest .*--resume-matrix-cell=stale_xfail\[take2-auto-ckpt2\]",
                     smallest), out[-3000:]


def test_a_warm_up_the_fork_server_cannot_import_is_named_with_the_fix(project):
    """Item 7: a warm-up module the fork server could not import made every run slower without a word."""
    code, out = matrix(project, "missing_helper", "-k", "ckpt1]")
    assert code == 0, out[-3000:]
    assert ("ResumeCheckWarning: resume-check: target 'missing_helper': the warm-up 'helpres:warm_up' failed in the "
            "fork server: ModuleNotFoundError: No module named 'helpres'") in out, out[-3000:]
    assert "put the folder that holds 'helpres' on it" in out


def test_a_warm_up_that_trains_a_torch_step_leaves_forked_runs_working(project):
    """A warm-up running one training step started torch's thread pool in the fork
    server and every forked run hung. The server runs warm-ups with one intra-op thread."""
    code, out = matrix(project, "threaded_torch", "-k", "ckpt1] or ckpt2]", "--resume-matrix-hang-timeout=30")
    assert code == 0, out[-3000:]
    assert "HUNG" not in out and "ResumeCheckWarning" not in out


def test_a_warm_up_that_leaves_a_thread_running_is_refused_by_name(project):
    code, out = matrix(project, "leaves_thread", "-k", "ckpt1]")
    assert code == 1, out[-3000:]
    assert ("target 'leaves_thread': the warm-up 'helpers:start_thread' left 1 more thread running in the fork "
            "server") in out, out[-3000:]
    assert "HUNG" not in out
