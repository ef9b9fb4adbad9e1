"""What the cells' reports carry: a judged cell's JSON rides on its report (so an xdist controller gets it
too), a cell that failed without a verdict gets one made from its report, and every cell its junit
class name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_resume_check.plugin.settings import MATRIX_NODE, NODE_PREFIX
from pytest_resume_check.records import kill_ids

if TYPE_CHECKING:
    from pytest_resume_check.records.cell_json import CellJson

#: The attribute of a ``TestReport`` that carries the cell's JSON.
CELL_ATTRIBUTE = "resume_check_cell"
#: The user property of a cell that made its case's reference runs: how long they took.
REFERENCE_SECONDS = "reference_seconds"
#: The word ``-v`` shows for such a cell when it passes.
PASSED_PAYING = "PASSED (reference runs {seconds:.1f} s)"


def carry(report: pytest.TestReport, cell_json: CellJson, reference_seconds: float) -> None:
    """Put the cell's JSON on its call report, and (when this cell made its case's reference runs) how
    long those took."""
    setattr(report, CELL_ATTRIBUTE, cell_json)
    if reference_seconds:
        report.user_properties.append((REFERENCE_SECONDS, round(reference_seconds, 3)))


def carried(report: pytest.TestReport) -> CellJson | None:
    """The cell JSON a report carries, if any."""
    return getattr(report, CELL_ATTRIBUTE, None)


def teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """With ``-v``, a passing cell that made its case's reference runs says how long they took: that time
    counts toward its own duration (and a pytest-timeout limit), not the others'. (A failing cell keeps
    pytest's plain ``FAILED``, so its line still starts with the node id to paste.) None: pytest's own."""
    paid = dict(report.user_properties).get(REFERENCE_SECONDS) if report.when == "call" else None
    if not paid or not report.passed or hasattr(report, "wasxfail") or cell_name(report) is None:
        return None
    return report.outcome, ".", PASSED_PAYING.format(seconds=paid)


def cell_name(report: pytest.TestReport) -> str | None:
    """The matrix cell a report is of (``target[case-mode-kill]``), None for any other test."""
    return report.nodeid[len(NODE_PREFIX):] if report.nodeid.startswith(NODE_PREFIX) else None


def skip_reason(report: pytest.TestReport) -> str:
    """Why a test was skipped (``""`` for one that was not): the reason given to its skip."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return ""
    reason = str(report.longrepr[2])
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def failed_unjudged(report: pytest.TestReport) -> bool:
    """A report of a failure that carries no cell JSON (``???``: xdist's crashed worker)."""
    return carried(report) is None and report.failed and report.when in ("call", "???")


def unjudged(report: pytest.TestReport, name: str, rerun: str) -> CellJson | None:
    """The JSON of the matrix cell ``name`` that failed without a verdict, so the summary counts it as
    pytest does (a crashed xdist worker's cell was drawn as passed and missing from the JSON).
    None when ``name`` is no cell's (a target whose matrix cannot be built)."""
    from pytest_resume_check.judge import harness_errors
    from pytest_resume_check.report import text as rp

    parts = kill_ids.split_cell_name(name)
    if parts is None:
        return None
    target, case, mode, kill = parts
    try:
        kills = kill_ids.parse_kill_id(kill)
    except ValueError:
        kills = ()
    lines = [ln.strip() for ln in str(report.longreprtext).strip().splitlines() if ln.strip()]
    what = lines[-1] if lines else "no details"  # xdist: "worker 'gw0' crashed while running '...'"
    template = harness_errors.MSG_WORKER_CRASHED if report.when == "???" else harness_errors.MSG_BUG
    headline = template.format(what=what[:200], kept="")
    cell = rp.unjudged_cell_json(target, case, mode, kills, kill, headline)
    cell["rerun"] = rerun
    return cell


def set_junit_classname(config: pytest.Config, report: pytest.TestReport) -> None:
    """``resume-matrix.<target>``, so CI views group the cells by target (from the node id alone it
    is ``resume-matrix`` for all). Set before junitxml records the report; it keeps such attributes."""
    from _pytest import junitxml

    key = getattr(junitxml, "xml_key", None)
    xml = config.stash.get(key, None) if key is not None else None
    target = dict(report.user_properties).get("target")
    if xml is not None and target:
        xml.node_reporter(report).add_attribute("classname", f"{MATRIX_NODE}.{target}")
