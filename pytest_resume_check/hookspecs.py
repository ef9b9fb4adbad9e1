"""Hooks other plugins and conftests can implement to shape the resume matrix."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["pytest_resume_check_cases", "pytest_resume_check_cell_result", "pytest_resume_check_targets"]


@pytest.hookspec(firstresult=True)
def pytest_resume_check_cases(config: pytest.Config, target: Any) -> Any:
    """Return the cases (a sequence of dicts) to run for ``target`` instead of ``target.cases``:
    add axes, or narrow them. ``None`` keeps the target's own cases."""


def pytest_resume_check_targets(config: pytest.Config, targets: list[Any]) -> None:
    """Called with the targets this session runs (the project's own, or the ones named with
    ``--resume-matrix-target`` / ``resume_matrix_targets``); add or remove entries in place."""


def pytest_resume_check_cell_result(config: pytest.Config, result: Any) -> None:
    """Called after each matrix cell is judged, with its ``CellResult`` (for custom reports)."""
