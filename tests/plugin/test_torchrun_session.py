"""A user's two-worker DDP job declared with ``launcher="torchrun"``, run through pytest as a user runs
it: its matrix passes, each cell that kills one worker is an in-job restart whose JSON shows the restart and
the checkpoint each worker of it restored, and a job whose restart does not reload fails with a rerun line
that reproduces it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from leftovers import interruptible, marked, settle  # noqa: E402
from project_session import pytest_in  # noqa: E402

CONFTEST = """
from pytest_resume_check import resume_target
from pytest_resume_check.builtin import ddp


def restart_fresh(run):
    ddp.train(run, "restart_fresh")


OPTIONS = dict(steps=ddp.total_steps(2), boundaries=lambda case: ddp.epoch_boundaries(2),
               cases=({"id": "shuffle", "shuffle": True},), world_size=2, launcher="torchrun", max_restarts=1,
               preemption=(2.0,), resume_modes=("auto",), crash_save=False)
ddp_job = resume_target(ddp.correct_ddp, name="ddp_job", **OPTIONS)
ddp_fresh = resume_target(restart_fresh, name="ddp_fresh", **OPTIONS)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "p"
    path.mkdir()
    (path / "conftest.py").write_text(CONFTEST)
    return path


def test_a_torchrun_job_passes_its_matrix_and_shows_each_restart(project, tmp_path):
    report = tmp_path / "cells.json"
    code, out = pytest_in(project, "--resume-matrix", "-n", "2", "-p", "no:cacheprovider",
                          "--resume-matrix-target=ddp_job", f"--resume-matrix-json={report}")
    assert code == 0, out[-3000:]
    cells = json.loads(report.read_text())["cells"]
    assert len(cells) >= 20 and all(c["passed"] for c in cells)
    assert re.search(rf"resume matrix: {len(cells)} cells, 0 failing", out)
    restarts = [c for c in cells if c["kill"].endswith(":rank1")]
    assert {c["kill"] for c in restarts} == {"ckpt6:rank1", "ckpt6+1:rank1"}
    for cell in restarts:  # one torchrun job: its first attempt, then torchrun's restart resuming from step 6
        first, restart = cell["runs"]
        assert (first["restart"], first["outcome"]) == (0, "killed")
        assert (restart["restart"], restart["outcome"]) == (1, "done")
        assert restart["resumed_by_rank"] == {"0": 6, "1": 6}
        assert first["log_file"] == restart["log_file"]
    assert all(run["launcher"] == "torchrun" for c in cells for run in c["runs"])


def test_a_restart_that_does_not_reload_fails_and_its_rerun_line_reproduces_it(project):
    code, out = pytest_in(project, "--resume-matrix", "-p", "no:xdist", "-p", "no:cacheprovider",
                          "--resume-matrix-target=ddp_fresh", "-k", "rank1")
    assert code == 1, out[-3000:]
    assert "STALE_RESUME: run 2 started fresh (resumed step 0) but step_6 was published before the kill" in out
    assert "torchrun's restart 1: ran to the end" in out
    rerun = shlex.split(re.search(r"rerun: (pytest .*ckpt6\+1:rank1.*)$", out, re.M).group(1))
    code, again = pytest_in(project, *rerun[1:], "-p", "no:cacheprovider")
    assert code == 1 and "1 failed" in again.splitlines()[-1], again[-2000:]
    assert "STALE_RESUME: run 2 started fresh" in again


def test_ctrl_c_in_a_torchrun_job_leaves_no_agent_worker_or_port(tmp_path):
    """Ctrl-C while torchrun's agents and workers run (two simulated nodes, so an agent forked by the run's
    process too): pytest ends interrupted, and nothing that carries the session's canary is left."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST + "ddp_nodes = resume_target(ddp.correct_ddp, name='ddp_nodes', "
                                         "**{**OPTIONS, 'nnodes': (1, 2)})\n")
    canary, basetemp = uuid.uuid4().hex, tmp_path / "bt"
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", "--resume-matrix",
            "--resume-matrix-target=ddp_nodes", f"--basetemp={basetemp}")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *args],
                            cwd=project, env={**os.environ, "LEFTOVER_CANARY": canary, "PYTHONPATH": str(project)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    # Under way: a cell's run has started torchrun (its files' folder exists) and agents of both nodes live.
    while proc.poll() is None and time.monotonic() < deadline and not (
            list(basetemp.glob("**/auto-*/run0.log.torchrun-node1")) and len(marked(canary)) >= 5):
        time.sleep(0.05)
    assert proc.poll() is None, "the session ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    out, _ = proc.communicate(timeout=120)  # a guard against a hang, not a speed claim
    assert proc.returncode == 2, out[-3000:]
    assert "KeyboardInterrupt" in out
    assert settle(canary) == []
