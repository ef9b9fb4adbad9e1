"""A whole matrix session: the grid, the smallest failing kill point, and xdist giving the same
verdicts as a serial run."""

from __future__ import annotations

import json

import pytest
from optional import requires

from pytest_resume_check.records import kill_ids
from pytest_resume_check.report import summary

CONFTEST = """
from pytest_resume_check import resume_target
from pytest_resume_check.builtin import loop

PRELOAD = loop.PRELOAD
CASES = [{"id": "take2", "take": 2, "n": 8}, {"id": "take4", "take": 4, "n": 8}]

correct = resume_target(loop.correct_loop, name="correct", steps=loop.total_steps, cases=CASES,
                        boundaries=loop.epoch_boundaries, preload=PRELOAD)
drop = resume_target(loop.loop_drop_buffer, name="drop", steps=loop.total_steps, cases=CASES,
                     boundaries=loop.epoch_boundaries, preload=PRELOAD)
"""
ARGS = ("-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-seed=9",
        "--resume-matrix-target=correct", "--resume-matrix-target=drop")


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    return pytester


def verdicts(path):
    cells = json.loads(path.read_text())["cells"]
    return {summary.cell_name(c): (tuple(c["categories"]), c["headline"]) for c in cells}


@requires("torch", "torchdata")
def test_serial_and_xdist_runs_give_identical_verdicts(project):
    project.runpytest_subprocess(*ARGS, "--resume-matrix-json=serial.json")
    project.runpytest_subprocess(*ARGS, "-n", "2", "--resume-matrix-json=parallel.json")
    serial, parallel = verdicts(project.path / "serial.json"), verdicts(project.path / "parallel.json")
    assert serial == parallel
    assert any(cats == ("LOST", "STATE_DIVERGED") for cats, _ in serial.values())  # the comparison is not vacuous


@requires("torch", "torchdata")
def test_summary_shows_a_grid_per_target_and_the_smallest_failing_kill_point(project):
    result = project.runpytest_subprocess(*ARGS)
    result.stdout.fnmatch_lines([
        "*resume matrix: * cells, * failing, 0 expected failures, seed 9*",
        "correct: * cells, columns are kill points*",
        "take2 auto * . . . . *",
        "drop: * cells, columns are kill points*",
        "take2 auto * L . L . *",
        "smallest failing kill point of each failing case:",
        "  drop[[]take2-auto-ckpt1[]]: STATE_DIVERGED at step 1 (the restored step of resume from step_1): buffer "
        "differs (0.0), *",
        "    rerun: pytest *--resume-matrix-cell=drop[[]take2-auto-ckpt1[]]*",
    ])
    assert all(len(line) <= 100 for line in result.outlines if line.startswith(("take", "correct", "drop")))


def with_kills(cell):
    """A hand-made cell JSON with its structured kill points, as report.cell_json writes them."""
    return {**cell, "kills": [k.to_json() for k in kill_ids.parse_kill_id(cell["kill"])]}


def test_grid_marks_each_category_and_expected_failures():
    cells = [
        {"target": "t", "case_id": "c", "resume_mode": "auto", "kill": "ckpt1", "passed": True,
         "categories": [], "xfail_reason": None},
        {"target": "t", "case_id": "c", "resume_mode": "auto", "kill": "ckpt2", "passed": False,
         "categories": ["DUPLICATED", "LOST"], "xfail_reason": None},
        {"target": "t", "case_id": "c", "resume_mode": "auto", "kill": "ckpt0+2", "passed": False,
         "categories": ["REORDERED"], "xfail_reason": "known"},
    ]
    lines = summary.grid([with_kills(c) for c in cells])
    assert lines[1].split() == ["1", "2", "0+2"]
    assert lines[2].split() == ["c", "auto", ".", "D", "x"]


def test_smallest_failure_prefers_one_kill_and_the_earliest_step():
    base = {"target": "t", "case_id": "c", "resume_mode": "auto", "passed": False, "categories": ["LOST"],
            "xfail_reason": None}
    cells = [with_kills({**base, "kill": k}) for k in ("ckpt1_ckpt5+1", "ckpt4", "ckpt0+2", "ckpt3")]
    assert [c["kill"] for c in summary.smallest_failures(cells)] == ["ckpt0+2"]
