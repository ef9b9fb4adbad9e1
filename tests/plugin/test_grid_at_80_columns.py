"""A real session at 80 columns (the width of a CI log or a redirected file) shows every cell of
its grid, each with its mark: the summary is parsed back and compared with the JSON report's cells.
A torch-free project; pytest in a subprocess with ``COLUMNS=80`` and no terminal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from project_trainer import write_project

from pytest_resume_check.report import summary

WIDTH = 80
#: Row labels long enough that the kill points of the full matrix wrap at 80 columns.
CASES = "[{'id': 'a-case-id-as-long-as-a-ci-log-allows'}, {'id': 'with-a-planted-lost-input', 'skip': True}]"


def shown_marks(lines):
    """((row, column), mark) of every mark in one grid's chunks (lines from its first chunk header to the
    blank line after its table)."""
    shown = []
    at = 0
    while at < len(lines) and lines[at].strip():
        header = lines[at]
        label_width = len(header) - len(header.lstrip(" "))
        columns = [(m.start(), m[0]) for m in re.finditer(r"\S+", header)]
        at += 1
        while at < len(lines) and lines[at].strip() and not lines[at].startswith(" "):
            row = lines[at]
            shown += [((row[:label_width].rstrip(), column), row[start]) for start, column in columns
                      if start < len(row) and row[start] != " "]
            at += 1
    return shown


def test_every_cell_is_in_the_grid_of_a_session_at_80_columns(tmp_path):
    project = write_project(tmp_path / "project", "narrow", CASES)
    report = tmp_path / "cells.json"
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--resume-matrix", "--resume-matrix-mode=full", "--resume-matrix-seed=3",
                           f"--resume-matrix-json={report}", f"--basetemp={tmp_path / 'bt'}"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]  # the planted cases fail
    cells = json.loads(report.read_text())["cells"]
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith(f"narrow: {len(cells)} cells"))
    grid = lines[title + 1:lines.index("", title)]
    assert sum(1 for line in grid if line.startswith(" ")) >= 2, "\n".join(grid)  # it wrapped
    assert all(len(line) <= WIDTH for line in grid), "\n".join(grid)
    shown = shown_marks(grid)
    expected = [((f"{c['case_id']} {c['resume_mode']}", summary.column(c)), summary.mark(c)) for c in cells]
    assert sorted(shown) == sorted(expected), "\n".join(grid)
    assert {mark for _, mark in shown} == {".", "L"}
