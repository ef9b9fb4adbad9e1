"""``--resume-matrix-cell`` given more than once runs each cell named (not only the last one), and an
unknown name among them is one usage error naming it. The trainer is the torch-free one of
``project_trainer.py``, so these run in every environment."""

from __future__ import annotations

import re

import pytest
from project_trainer import write_project

SEED = "--resume-matrix-seed=3"
OK, BUG = "files[ok-auto-ckpt1]", "files[bug-auto-ckpt3]"


@pytest.fixture
def project(pytester):
    write_project(pytester.path, "files", "[{'id': 'ok'}, {'id': 'bug', 'skip': True}]")
    return pytester


def ran(result):
    """The matrix cells a ``-v`` session ran, with their outcomes."""
    return re.findall(r"^(resume-matrix::\S+) (PASSED|FAILED)", result.stdout.str(), re.M)


def test_two_cell_options_run_exactly_those_two_cells(project):
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix", SEED, "-v",
                                          f"--resume-matrix-cell={OK}", f"--resume-matrix-cell={BUG}")
    assert sorted(ran(result)) == [(f"resume-matrix::{BUG}", "FAILED"), (f"resume-matrix::{OK}", "PASSED")], \
        result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1, failed=1, deselected=None)
    # Each failing cell's rerun line still names that one cell.
    rerun = [ln for ln in result.outlines if "rerun: pytest " in ln]
    assert rerun and all(ln.count("--resume-matrix-cell=") == 1 and BUG in ln for ln in rerun)


def test_the_same_cell_named_twice_runs_once(project):
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix", SEED, "-v",
                                          f"--resume-matrix-cell={OK}", f"--resume-matrix-cell={OK}")
    assert ran(result) == [(f"resume-matrix::{OK}", "PASSED")], result.stdout.str()[-3000:]


def test_an_unknown_cell_among_two_is_one_usage_error_naming_it(project):
    # The unknown one first: the last one given is a real cell, and it must not run alone.
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix", SEED, "-v",
                                          "--resume-matrix-cell=files[nope-auto-ckpt1]", f"--resume-matrix-cell={OK}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.errlines if "no such cell" in ln]
    assert errors == ["ERROR: --resume-matrix-cell 'files[nope-auto-ckpt1]': no such cell in this matrix (mode "
                      "quick, seed 3); check the mode and seed the cell came from (its rerun line has both)"], \
        result.errlines
    assert not ran(result)
