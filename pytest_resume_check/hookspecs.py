"""Hooks other plugins and conftests can implement to shape the resume matrix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

__all__ = ["pytest_resume_check_cases", "pytest_resume_check_cell_result", "pytest_resume_check_targets"]

if TYPE_CHECKING:  # named in the signatures only: loading the hook specs imports neither
    from pytest_resume_check.records.results import CellResult
    from pytest_resume_check.targets import Target


@pytest.hookspec(firstresult=True)
def pytest_resume_check_cases(config: pytest.Config, target: Target) -> Sequence[Mapping[str, object]] | None:
    """Return the cases (a sequence of dicts) to run for ``target`` instead of ``target.cases``:
    add axes, or narrow them. ``None`` keeps the target's own cases."""


@pytest.hookspec
def pytest_resume_check_targets(config: pytest.Config, targets: list[Target]) -> None:
    """Called with the targets this session runs (the project's own, or the ones named with
    ``--resume-matrix-target`` / ``resume_matrix_targets``); add or remove entries in place."""


@pytest.hookspec
def pytest_resume_check_cell_result(config: pytest.Config, result: CellResult) -> None:
    """Called after each matrix cell is judged, with its ``CellResult`` (for custom reports)."""
