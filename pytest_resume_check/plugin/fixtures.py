"""The ``resume_check`` fixture: hand-written resume tests with the engine of the matrix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_resume_check.plugin.settings import SETTINGS_KEY
from pytest_resume_check.records.names import OPT_SEED

if TYPE_CHECKING:  # the engine is imported when a test asks for the fixture
    from collections.abc import Mapping

    from pytest_resume_check.records.plan import KillSpec
    from pytest_resume_check.records.results import CellResult
    from pytest_resume_check.targets import Target


class ResumeCheck:
    """What the ``resume_check`` fixture gives a test: run a target, kill it, resume it, judge it."""

    def __init__(self, root: Path, seed: int, hang_timeout: float, hang_forced: bool = False):
        from pytest_resume_check.engine import Engine

        self.engine = Engine(root, seed, hang_timeout, hang_forced=hang_forced)

    def kill_after_checkpoint(self, step: int, extra_steps: int = 0) -> KillSpec:
        """Kill right after the checkpoint of ``step`` is published, or ``extra_steps`` later."""
        from pytest_resume_check.records.plan import KillSpec

        return KillSpec(step, extra_steps)

    def run(self, target: Target, *, kills: KillSpec | list[KillSpec] | tuple[KillSpec, ...],
            case: Mapping[str, object] | None = None, resume_mode: str = "auto") -> CellResult:
        """Reference run, then the interrupted runs; returns a ``CellResult`` (``.verdict``,
        ``.verdict.composite``, ``.runs``). ``kills``: one ``KillSpec`` per killed run."""
        from pytest_resume_check.cells.matrix import Cell

        case = dict(case if case is not None else target.cases[0])
        kills = tuple(kills) if isinstance(kills, (list, tuple)) else (kills,)
        cell = Cell(target, case, resume_mode, kills, int(target.steps(case)))
        return self.engine.run_cell(cell)

    @property
    def seed(self) -> int:
        """The session seed these runs use (``--resume-matrix-seed`` reproduces it)."""
        return self.engine.seed

    def report(self, result: CellResult) -> str:
        """The failure text of a result (headline, excerpt, runs, kept files, seed)."""
        from pytest_resume_check.report import text as report

        return report.failure_text(result, f"rerun this test with {OPT_SEED}={self.seed}")


@pytest.fixture
def resume_check(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ResumeCheck]:
    """Run targets in real child processes, SIGKILL them at chosen points, resume, and judge."""
    settings = request.config.stash[SETTINGS_KEY]
    check = ResumeCheck(tmp_path / "resume-check", settings.seed, settings.hang_timeout, settings.hang_forced)
    yield check
    problems = check.engine.close()  # the services the test's targets started
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
