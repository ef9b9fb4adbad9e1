"""``--resume-matrix-budget=RUNS`` in a user's session: the cells that reveal most run within the
budget, the rest are skipped and listed in one line; the same cells with xdist; a bad value is one usage
error; a cell named to rerun runs whatever the budget. A project of its own in a temporary folder with the
torch-free trainer of ``tests/support/project_trainer.py`` (case ``bug``: a resume loses its first input)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from project_session import pytest_in, write_project

SERIAL = ("--resume-matrix", "-p", "no:xdist", "-p", "no:cacheprovider")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "p")


def budget_line(out: str) -> re.Match[str]:
    found = re.search(r"^resume matrix: left out by --resume-matrix-budget=(\d+): the (\d+) cells that reveal most "
                      r"take (\d+) of the (\d+) runs of all (\d+) cells; (\d+) left out: (.*)$", out, re.M)
    assert found, out[-3000:]
    return found


def test_a_budget_runs_the_most_telling_cells_within_it_and_lists_the_rest(project, tmp_path):
    report = tmp_path / "cells.json"
    code, out = pytest_in(project, *SERIAL, "--resume-matrix-budget=10",
                          f"--resume-matrix-json={report}")
    line = budget_line(out)
    budget, kept, runs, total, cells, left = map(int, line.groups()[:6])
    assert budget == 10 and runs <= 10 < total and kept + left == cells
    ran = json.loads(report.read_text())["cells"]
    assert len(ran) == kept
    assert f"{left} skipped" in out.splitlines()[-1]
    listed = re.findall(r"(?:ok|bug)-(?:auto|path)-[\w+:]+", line.group(7))
    ran_ids = {f"{c['case_id']}-{c['resume_mode']}-{c['kill']}" for c in ran}
    assert len(listed) == left and not ran_ids & set(listed)
    # the planted bug is caught within a fifth of the matrix's runs: each case and mode comes early
    assert code == 1 and any(c["case_id"] == "bug" and not c["passed"] for c in ran), out[-3000:]
    assert {(c["case_id"], c["resume_mode"]) for c in ran} >= {("ok", "auto"), ("bug", "auto")}


def test_xdist_workers_cut_the_same_matrix(project):
    _, serial = pytest_in(project, *SERIAL, "--resume-matrix-budget=14")
    _, parallel = pytest_in(project, "--resume-matrix", "-n", "2", "-p", "no:cacheprovider",
                            "--resume-matrix-budget=14")
    assert budget_line(serial).group(0) == budget_line(parallel).group(0)


def test_a_named_cell_runs_whatever_the_budget(project):
    code, out = pytest_in(project, *SERIAL, "--resume-matrix-budget=1",
                          "--resume-matrix-cell=files[ok-auto-ckpt3]")
    assert code == 0 and "1 passed" in out.splitlines()[-1], out[-2000:]
    assert "left out by" not in out


@pytest.mark.parametrize("where, value, named", [
    ("option", "0", "--resume-matrix-budget='0'"),
    ("option", "ten", "--resume-matrix-budget='ten'"),
    ("ini", "-3", "ini resume_matrix_budget='-3'"),
])
def test_a_bad_budget_is_one_usage_error_naming_the_fix(project, where, value, named):
    args = ["--resume-matrix"]
    if where == "ini":
        (project / "pytest.ini").write_text(f"[pytest]\nresume_matrix_budget = {value}\n")
    else:
        args.append(f"--resume-matrix-budget={value}")
    code, out = pytest_in(project, "-p", "no:xdist", "-p", "no:cacheprovider", *args)
    assert code == 4, out[-2000:]
    assert f"{named} is not a budget; give the most trainer runs the matrix may make" in out
    assert "Traceback" not in out
