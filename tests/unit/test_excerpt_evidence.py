"""The evidence a failing cell shows is its finding's own ledger: the excerpt's ``[x]`` marks the first entry
where the two shown sequences differ (never one equal on both sides), a verdict whose first finding about
inputs is on the trained ledger shows the trained ledger (in the text, the cell's JSON and the HTML timeline),
a cell with findings on both ledgers shows the first one's and names the other, and a finding of one rank's
own ledger shows that rank's entries. Pure: recorded events, no processes."""

from __future__ import annotations

import re

import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.ledger import Entry, Ledger
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import CellResult, Outcome, RunRecord
from pytest_resume_check.report import html
from pytest_resume_check.report import text as report
from pytest_resume_check.targets import Contract, resume_target

STEPS = 4
BOTH = Contract(ledgers=("consumed", "trained"))


def trainer(run):
    """Never run."""


TARGET = resume_target(trainer, name="t", steps=STEPS, contract=BOTH)


def ledger(*ids, run_from=None, epoch=0):
    """Entries of the given ids, one step each; entries from index ``run_from`` on are run 1's."""
    return Ledger(Entry(i, n + 1, epoch, int(run_from is not None and n >= run_from)) for n, i in enumerate(ids))


def marked(line):
    """The entries an excerpt line marks with ``[x]``."""
    return re.findall(r"\[([^\]]+)\]", line)


@pytest.mark.parametrize(
    ("reference", "composite", "mark_ref", "mark_res"),
    [
        pytest.param(ledger(0, 1, 2, 3, 4), ledger(0, 1, 3, 4, run_from=2), "2@e0", "3@e0", id="lost"),
        pytest.param(ledger(0, 1, 2, 3), ledger(0, 1, 0, 1, 2, 3, run_from=2), "2@e0", "0@e0", id="duplicated"),
        pytest.param(ledger(0, 1, 2, 3), ledger(0, 1, 3, 2, run_from=2), "2@e0", "3@e0", id="reordered"),
        pytest.param(ledger(0, 1, 2, 3), ledger(0, 1, 2, run_from=2), "3@e0", "end", id="ends-early"),
    ],
)
def test_the_excerpt_marks_the_first_entry_where_the_two_sequences_differ(reference, composite, mark_ref, mark_res):
    lines = report.excerpt(reference, composite)
    assert [marked(line) for line in lines] == [[mark_ref], [mark_res]]


def test_an_epoch_label_alone_is_a_difference_the_marker_lands_on():
    reference = ledger(0, 1, 2, 3)
    composite = Ledger([*reference[:2], *(Entry(e.id, e.step, 1, 1) for e in reference[2:])])
    assert [marked(line) for line in report.excerpt(reference, composite)] == [["2@e0"], ["2@e1"]]


def test_equal_sequences_have_no_excerpt():
    assert report.excerpt(ledger(0, 1, 2, 3), ledger(0, 1, 2, 3, run_from=2)) == []


# -- a verdict's evidence --------------------------------------------------------------------------------

def record(events, outcome=Outcome.DONE, is_resume=False, kill=None):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/nonexistent/run.log", is_resume=is_resume, kill=kill)
    return RunRecord(plan, list(events), outcome, 0)


def steps(first, last, trained_lost=(), consumed_lost=(), ranks=None):
    """Events of steps ``first``..``last``: each consumes ids 2s-2 and 2s-1 and trains them in the same step;
    ``*_lost``: steps whose inputs that ledger never gets; ``ranks``: per step, the ranks' share in order."""
    out = []
    for s in range(first, last + 1):
        ids = (2 * s - 2, 2 * s - 1)
        if ranks is not None:
            out += [ev.Event(ev.CONSUMED, step=s, epoch=0, ids=(i,), rank=r) for r, i in zip(ranks(s), ids)]
        else:
            if s not in consumed_lost:
                out.append(ev.Event(ev.CONSUMED, step=s, epoch=0, ids=ids))
            if s not in trained_lost:
                out.append(ev.Event(ev.TRAINED, step=s, epoch=0, ids=ids))
        out.append(ev.Event(ev.STEP_END, step=s))
    return out


def judged(contract=BOTH, **lost):
    """A cell killed right after the checkpoint of step 2, whose resumed run loses what ``lost`` says."""
    reference = record(steps(1, STEPS, ranks=lost.get("ranks") and (lambda s: (0, 1))))
    first = record([*steps(1, 2, ranks=lost.get("ranks") and (lambda s: (0, 1))),
                    ev.Event(ev.CHECKPOINT, step=2, path="/ckpt/step_2")], Outcome.KILLED, kill=KillSpec(2))
    resumed = record([ev.Event(ev.RESUMED, step=2, path="/ckpt/step_2"), *steps(3, STEPS, **lost)], is_resume=True)
    verdict = vd.judge(reference, [first, resumed], contract)
    return CellResult(Cell(resume_target(trainer, name="t", steps=STEPS, contract=contract), {}, "auto",
                           (KillSpec(2),), STEPS), verdict, reference, [first, resumed])


def excerpt_of(text):
    """A failure text's excerpt: its title line (None without one), its reference and its resumed line."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("  resumed:   "))
    title = lines[end - 2] if lines[end - 2].endswith(":") else None
    return title, lines[end - 1], lines[end]


def test_a_loss_on_the_trained_ledger_alone_is_shown_on_the_trained_ledger():
    result = judged(trained_lost=(3,))
    verdict = result.verdict
    assert [(f.category, f.ledger) for f in verdict.findings] == [(vd.LOST, "trained")]
    assert verdict.composite.ids == verdict.reference.ids  # the consumed ledger agrees
    shown = verdict.evidence()
    assert (shown.ledger, shown.others, shown.rank) == ("trained", (), None)
    assert (shown.reference, shown.composite) == verdict.ledgers["trained"]

    title, reference, resumed = excerpt_of(report.failure_text(result))
    assert title == "  " + report.EVIDENCE_TITLE.format(ledger="trained", rank="", others="") + ":"
    assert marked(reference) == ["4@e0"] and marked(resumed) == ["6@e0"]  # step 3's inputs are never trained

    data = report.cell_json(result)
    assert data["ledger"] == "trained" and data["findings"][0]["ledger"] == "trained"
    assert data["reference"] == verdict.ledgers["trained"][0].to_json()
    assert data["marks"]["reference"] == "....LL.."
    timeline = html.timeline(data)
    assert (timeline["ledger"], timeline["others"]) == ("trained", [])
    assert html.TIMELINE_OF.format(title="trained ledger") in html.render([data])


def test_losses_on_both_ledgers_show_the_first_findings_ledger_and_name_the_other():
    result = judged(trained_lost=(3,), consumed_lost=(4,))
    assert [f.ledger for f in result.verdict.findings] == ["consumed", "trained"]
    shown = result.verdict.evidence()
    assert (shown.ledger, shown.others) == ("consumed", ("trained",))
    title, reference, resumed = excerpt_of(report.failure_text(result))
    assert title == "  consumed ledger (the trained ledger differs too):"
    assert marked(reference) == ["6@e0"] and marked(resumed) == ["end"]
    data = report.cell_json(result)
    assert data["ledger"] == "consumed" and [f["ledger"] for f in data["findings"]] == ["consumed", "trained"]
    assert html.ledgers_shown(data) == ("consumed", ["trained"])
    assert html.TIMELINE_OF.format(title="consumed ledger (the trained ledger differs too)") in html.render([data])


def test_a_loss_on_the_consumed_ledger_of_a_one_ledger_contract_reads_as_before():
    result = judged(Contract(), consumed_lost=(3,))
    lines = report.failure_text(result).splitlines()
    assert excerpt_of("\n".join(lines))[0] is None
    assert lines[1].startswith("  reference: ") and marked(lines[1]) == ["4@e0"]
    data = report.cell_json(result)
    assert data["ledger"] == "consumed" and report.evidence_title("consumed") is None
    assert html.TIMELINE_OF.split("{")[0] not in html.render([data])


def test_a_finding_of_one_ranks_own_ledger_shows_that_ranks_entries():
    """The two ranks swap their inputs from step 3 on: the job's whole ledger holds the same inputs per epoch
    (all an unordered contract asks of it), rank 0's own does not. Its 3rd entry, where it parts, is also the
    3rd of the whole ledger, which is the same on both sides."""
    result = judged(Contract(ordered=False), ranks=lambda s: (1, 0))
    finding = result.verdict.findings[0]
    assert (finding.category, finding.rank) == (vd.LOST, 0) and " on rank 0 " in finding.headline
    assert result.verdict.reference[2] == result.verdict.composite[2]
    title, reference, resumed = excerpt_of(report.failure_text(result))
    assert title == "  consumed ledger of rank 0:"
    assert marked(reference) == ["4@e0"] and marked(resumed) == ["5@e0"]


def test_a_cell_json_without_a_ledger_key_draws_its_timeline_unnamed():
    """A cell of JSON format 1 does not say which ledger its rows are: its timeline is drawn as before."""
    data = report.cell_json(judged(trained_lost=(3,)))
    del data["ledger"]
    for finding in data["findings"]:
        del finding["ledger"]
    assert html.ledgers_shown(data) == (None, [])
    assert html.timeline(data)["ledger"] is None
    assert html.TIMELINE_OF.split("{")[0] not in html.render([data])


def test_a_cell_without_a_verdict_names_no_ledger():
    data = report.unjudged_cell_json("t", "c", "auto", (KillSpec(1),), "ckpt1", "HARNESS: gone")
    assert data["ledger"] is None and data["findings"][0]["ledger"] is None
