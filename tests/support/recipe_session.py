"""What the recipe tests read of a recipe project's matrix session, run as a user runs it (pytester)."""

from __future__ import annotations

import re
from typing import Any

#: The summary line of a matrix session.
MATRIX_SUMMARY = re.compile(r"resume matrix: (\d+) cells, (\d+) failing, (\d+) expected failures")


def matrix_counts(result: Any) -> tuple[int, int, int]:
    """(cells, failing, expected failures) of the session's summary line."""
    summary = next((m.groups() for line in result.outlines if (m := MATRIX_SUMMARY.search(line))), None)
    assert summary is not None, result.stdout.str()[-3000:]
    cells, failing, expected = map(int, summary)
    return cells, failing, expected


def assert_one_smoke_xfail(result: Any, resume_cells: int, cell: str) -> None:
    """The session ran more than ``resume_cells`` cells (the default crash smoke cells on top), none failed,
    and exactly one was an expected failure: the cell matching the regular expression ``cell`` (run with
    ``-rx``, so the summary lists it)."""
    cells, failing, expected = matrix_counts(result)
    assert cells > resume_cells and (failing, expected) == (0, 1), result.stdout.str()[-3000:]
    result.assert_outcomes(passed=cells - 1, xfailed=1)
    assert re.search(rf"^XFAIL resume-matrix::{cell}", result.stdout.str(), re.M), result.stdout.str()[-3000:]
