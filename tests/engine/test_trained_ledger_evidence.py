"""The evidence of a failing cell is the ledger its finding is about: a trainer whose checkpoint drops the
batch buffered between consuming and training (``tests/support/trained_buffer_target.py``) loses inputs on
the trained ledger while its consumed ledger agrees, and the excerpt, the cell's JSON and the HTML timeline
show the trained ledger, with ``[x]`` on an entry that differs. Torch-free real runs through the engine."""

from __future__ import annotations

import json
import re

import trained_buffer_target as trainer

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.report import html
from pytest_resume_check.report.text import JSON_FORMAT, cell_json, evidence_title, failure_text
from pytest_resume_check.targets import Contract, resume_target

BOTH = Contract(ledgers=("consumed", "trained"))
#: Killed right after the checkpoint of step 2: the batch of step 2 (ids 2, 3) waits in the buffer.
KILL = KillSpec(2)
LOST_IDS = trainer.batch_of(2)


def marked(line: str) -> str:
    """The entry an excerpt line marks with ``[x]``."""
    return re.search(r"\[([^\]]+)\]", line).group(1)


def run(tmp_path, case):
    engine = Engine(tmp_path, seed=1, hang_timeout=60)
    target = resume_target(trainer.train, name="trained_buffer", steps=trainer.STEPS, contract=BOTH,
                           resume_modes=["auto"], crash_save=False)
    cell = Cell(target, case, "auto", (KILL,), trainer.STEPS)
    engine.register([cell])
    try:
        return engine.run_cell(cell)
    finally:
        engine.close()


def test_a_trained_ledger_loss_shows_the_trained_ledger_in_the_excerpt_json_and_timeline(tmp_path):
    result = run(tmp_path, {"id": "drop"})
    verdict = result.verdict
    assert [(f.category, f.ledger) for f in verdict.findings] == [(vd.LOST, "trained")]
    assert verdict.composite.ids == verdict.reference.ids  # the consumed ledger agrees
    assert verdict.findings[0].ids == tuple(LOST_IDS)

    lines = failure_text(result).splitlines()
    assert lines[0].endswith("[trained ledger]")
    assert lines[1] == "  " + evidence_title("trained") + ":"
    reference, resumed = lines[2], lines[3]
    assert reference.startswith("  reference: ") and resumed.startswith("  resumed:   ")
    assert marked(reference) == f"{LOST_IDS[0]}@e0"  # the first input the resumed job never trained
    assert marked(resumed) != marked(reference)

    data = cell_json(result)
    trained_reference, trained_composite = verdict.ledgers["trained"]
    assert data["ledger"] == "trained"
    assert data["reference"] == trained_reference.to_json() and data["composite"] == trained_composite.to_json()
    assert data["findings"][0]["ledger"] == "trained"
    assert [row[0] for row, mark in zip(data["reference"], data["marks"]["reference"])
            if mark == vd.MARK_LOST] == LOST_IDS
    assert json.loads(json.dumps(data)) == data  # plain JSON, as the report file holds it
    assert JSON_FORMAT == 2

    timeline = html.timeline(data)
    assert timeline["ledger"] == "trained" and timeline["others"] == []
    drawn = [(ident, mark) for group in timeline["ref"] for ident, mark in zip(group[3], group[4])]
    assert [ident for ident, mark in drawn if mark == vd.MARK_LOST] == LOST_IDS
    page = html.render([data])
    assert html.TIMELINE_OF.format(title=evidence_title("trained")) in page


def test_losses_on_both_ledgers_show_the_first_findings_ledger_and_name_the_other(tmp_path):
    result = run(tmp_path, {"id": "both", "skip": True})
    assert [(f.category, f.ledger) for f in result.verdict.findings] == [(vd.LOST, "consumed"), (vd.LOST, "trained")]
    lines = failure_text(result).splitlines()
    title = evidence_title("consumed", ["trained"])
    assert title == "consumed ledger (the trained ledger differs too)"
    at = lines.index("  " + title + ":")
    assert marked(lines[at + 1]) == f"{trainer.batch_of(3)[0]}@e0" != marked(lines[at + 2])
    data = cell_json(result)
    assert data["ledger"] == "consumed" and [f["ledger"] for f in data["findings"]] == ["consumed", "trained"]
    assert html.timeline(data)["others"] == ["trained"]


def test_the_fixed_trainer_passes_on_both_ledgers(tmp_path):
    result = run(tmp_path, {"id": "fixed", "keep_buffer": True})
    assert result.passed, failure_text(result)
    assert cell_json(result)["ledger"] == "consumed"
