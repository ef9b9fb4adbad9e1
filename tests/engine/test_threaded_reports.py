"""Report calls from several threads: a trainer that publishes checkpoints from a background saver
(as torch DCP's async_save users do) gets the same, right verdict every time."""

from __future__ import annotations

import async_saver_target as saver
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.targets import resume_target

TARGET = resume_target(saver.train, name="async_saver", steps=saver.STEPS)
KILLS = [(KillSpec(2),), (KillSpec(3, 2),), (KillSpec(5),), (KillSpec(1), KillSpec(4, 1))]


@pytest.mark.parametrize("mode", ["auto", "path"])
def test_checkpoints_published_from_a_background_thread_pass_every_time(tmp_path, mode):
    engine = Engine(tmp_path, seed=5, hang_timeout=30)
    verdicts = []
    for repeat in range(5):
        for kills in KILLS:
            result = engine.run_cell(Cell(TARGET, {"repeat": repeat}, mode, kills, saver.STEPS))
            verdicts.append(result.verdict.headline)
    assert verdicts == ["PASSED"] * len(verdicts)
