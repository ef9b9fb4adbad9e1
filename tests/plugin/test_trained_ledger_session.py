"""A session's reports of a cell that loses inputs on the trained ledger only: the trainer of
``tests/support/trained_buffer_target.py`` drops the batch buffered between consuming and training, so its
consumed ledger agrees. The failure text, ``--resume-matrix-json``, ``--resume-matrix-html`` and the README
of ``--resume-matrix-repro`` all show the trained ledger, and ``[x]`` marks an entry that differs. A project
of its own through ``pytester`` (torch-free), one cell."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import trained_buffer_target as trainer

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.names import OPT_HTML, OPT_JSON, OPT_REPRO
from pytest_resume_check.report import html
from pytest_resume_check.report import repro as repro_folder
from pytest_resume_check.report.text import JSON_FORMAT, evidence_title

CONFTEST = """
from pytest_resume_check import Contract, resume_target
import trained_buffer_target as trainer

trained_buffer = resume_target(trainer.train, name="trained_buffer", steps=trainer.STEPS,
                               contract=Contract(ledgers=("consumed", "trained")), cases=[{"id": "drop"}],
                               resume_modes=["auto"], crash_save=False)
"""
CELL = "trained_buffer[drop-auto-ckpt2]"
#: The batch of step 2, buffered when the run was killed right after its checkpoint.
LOST_IDS = trainer.batch_of(2)
TITLE = "  " + str(evidence_title("trained")) + ":"


@pytest.fixture
def project(pytester, monkeypatch):
    """The project, its session files under a short temporary folder of its own (the fork server's socket
    lives there, and its path has a length limit)."""
    tmp = tempfile.mkdtemp(prefix="rc-")
    monkeypatch.setenv("TMPDIR", tmp)
    pytester.makepyfile(trained_buffer_target=(Path(__file__).parents[1] / "support" /
                                               "trained_buffer_target.py").read_text())
    pytester.makeconftest(CONFTEST)
    yield pytester
    shutil.rmtree(tmp, ignore_errors=True)


def excerpt_after(lines: list[str], title: str) -> tuple[str, str]:
    """The reference and resumed lines under an excerpt's title."""
    at = lines.index(title)
    return lines[at + 1], lines[at + 2]


def marked(line: str) -> str:
    """The entry an excerpt line marks with ``[x]``."""
    return re.search(r"\[([^\]]+)\]", line).group(1)


def test_every_report_of_a_trained_ledger_loss_shows_the_trained_ledger(project):
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
                                          "--resume-matrix-seed=1", "--resume-matrix-target=trained_buffer",
                                          f"--resume-matrix-cell={CELL}", f"{OPT_JSON}=cells.json",
                                          f"{OPT_HTML}=report.html", f"{OPT_REPRO}=repro")
    result.assert_outcomes(failed=1)
    headline = "LOST 2 inputs after resume from step_2: ids 2, 3 (epoch 0) [trained ledger]"
    reference, resumed = excerpt_after([ln.rstrip() for ln in result.outlines], TITLE)
    assert marked(reference) == f"{LOST_IDS[0]}@e0" != marked(resumed)

    data = json.loads((project.path / "cells.json").read_text())
    assert data["format"] == JSON_FORMAT == 2
    cell = data["cells"][0]
    assert cell["headline"] == headline
    assert cell["ledger"] == "trained" and [f["ledger"] for f in cell["findings"]] == ["trained"]
    lost = [row[0] for row, mark in zip(cell["reference"], cell["marks"]["reference"]) if mark == vd.MARK_LOST]
    assert lost == LOST_IDS
    # The rows are the trained ledger's: the reference trains nothing at step 1 and ids 0, 1 at step 2.
    assert [row[:2] for row in cell["reference"][:2]] == [[0, 2], [1, 2]]

    page = (project.path / "report.html").read_text()
    assert html.TIMELINE_OF.format(title=evidence_title("trained")) in page
    timelines = json.loads(re.search(r'<script type="application/json" id="timelines">(.*?)</script>', page,
                                     re.S).group(1))
    assert timelines[0]["ledger"] == "trained"
    drawn = [(ident, mark) for group in timelines[0]["ref"] for ident, mark in zip(group[3], group[4])]
    assert [ident for ident, mark in drawn if mark == vd.MARK_LOST] == LOST_IDS

    readme = (Path(cell[repro_folder.CELL_KEY]) / repro_folder.README).read_text().splitlines()
    assert readme[3] == headline  # under the title and the opening fence
    reference, resumed = excerpt_after(readme, TITLE)
    assert marked(reference) == f"{LOST_IDS[0]}@e0" != marked(resumed)
