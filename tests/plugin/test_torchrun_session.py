"""A user's two-worker DDP job declared with ``launcher="torchrun"`` (issue 31), run through pytest as a user runs
it: its matrix passes, each cell that kills one worker is an in-job restart whose JSON shows the restart and
the checkpoint each worker of it restored, and a job whose restart does not reload fails with a rerun line
that reproduces it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

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
