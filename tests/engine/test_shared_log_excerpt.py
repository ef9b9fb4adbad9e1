"""A shared first run's log, quoted in a failing cell's report, stops at that cell's kill: the run went on
to the group's later kill points, and those lines never happened in this cell's job. Torch-free (the
trainer of ``step_logger_target.py`` logs ``step N`` at every step)."""

from __future__ import annotations

import step_logger_target as logger

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report.text import cell_json, failure_text
from pytest_resume_check.targets import resume_target

CASE = {"id": "replay1", "replay": [1]}  # the resume takes the restored step's input again: the cell fails


def run_log_section(text: str, run: int) -> list[str]:
    """The lines a failure report quotes under ``log of run N``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  log of run {run} "))
    section = []
    for ln in lines[start + 1:]:
        if not ln.startswith("    "):
            break
        section.append(ln.strip())
    return section


def test_the_log_of_a_shared_first_run_is_cut_at_the_cells_kill(tmp_path):
    engine = Engine(tmp_path, seed=1, hang_timeout=60)
    target = resume_target(logger.train, name="step_logger", steps=logger.STEPS)
    at2, at5 = (Cell(target, CASE, "auto", (KillSpec(step),), logger.STEPS) for step in (2, 5))
    engine.register([at2, at5])
    first, later = engine.run_cell(at2), engine.run_cell(at5)
    assert first.runs[0].pid == later.runs[0].pid  # one first run served both cells
    assert first.verdict.categories == [vd.DUPLICATED]

    text = failure_text(first)
    assert run_log_section(text, 1) == [f"{ev.LOG_PREFIX}step 1", f"{ev.LOG_PREFIX}step 2"], text
    assert run_log_section(text, 2)[0] == f"{ev.LOG_PREFIX}step 3"  # the resumed run's own log goes on
    assert "step 2" in open(first.runs[0].plan.log_path).read()  # the kept file is cut the same way
    assert "step 3" not in open(first.runs[0].plan.log_path).read()
    assert cell_json(first)["runs"][0]["log_tail"] == [f"{ev.LOG_PREFIX}step 1", f"{ev.LOG_PREFIX}step 2"]

    assert run_log_section(failure_text(later), 1) == [f"{ev.LOG_PREFIX}step {s}" for s in range(1, 6)]
    engine.close()
