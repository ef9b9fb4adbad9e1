"""How a report names the runs of a cell: a resumed run that ended before it said
what it restored is no restart from scratch; a timeline names the reference's rest after an early stop as the
reference's, not as one more run; a rerun line is never broken inside an argument."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import CellResult, Outcome, RunRecord, Verdict
from pytest_resume_check.report import html
from pytest_resume_check.report import text as report
from pytest_resume_check.targets import resume_target


def trainer(run):
    """Never run."""


TARGET = resume_target(trainer, name="t", steps=8)


def record(events, outcome, error=None, is_resume=True):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", is_resume=is_resume,
                   kill=None if is_resume else KillSpec(6))
    return RunRecord(plan, list(events), outcome, 0, error=error)


FIRST = record([ev.Event(ev.CHECKPOINT, step=6, path="/ckpt/step_6.pt")], Outcome.KILLED, is_resume=False)
EOF_ERROR = "Traceback (most recent call last):\n  ...\nEOFError: Ran out of input"


def story(*runs):
    return report.story(CellResult(Cell(TARGET, {}, "auto", (KillSpec(6),), 8), Verdict(), None, list(runs)))


def test_a_run_that_raised_before_reporting_its_resume_is_no_restart_from_scratch():
    raised = record([], Outcome.RAISED, EOF_ERROR)
    assert story(FIRST, raised) == ("run 1: killed right after checkpoint of step 6 was published -> run 2 (raised "
                                    "before reporting what it resumed): raised EOFError: Ran out of input")


@pytest.mark.parametrize("outcome, label", [
    (Outcome.RAISED, "raised before reporting what it resumed"),
    (Outcome.CRASHED, "died before reporting what it resumed"),
    (Outcome.HUNG, "hung before reporting what it resumed"),
    (Outcome.KILLED, "killed before reporting what it resumed"),
    (Outcome.DONE, vd.LABEL_NEVER_REPORTED),
])
def test_a_run_that_never_reported_its_resume_is_labelled_by_how_it_ended(outcome, label):
    assert vd.run_label(record([], outcome)) == label


@pytest.mark.parametrize("resumed, label", [(ev.Event(ev.RESUMED, step=0), "restart from scratch"),
                                            (ev.Event(ev.RESUMED, step=6, path="/ckpt/step_6.pt"),
                                             "resume from step_6.pt")])
def test_a_run_that_reported_its_resume_keeps_its_label_whatever_happened_next(resumed, label):
    assert vd.run_label(record([resumed], Outcome.RAISED, EOF_ERROR)) == label


# -- the timeline's run labels -------------------------------------------------------------------------------

def early_stopped_cell(runs):
    """Killed after checkpoint 2 of 8 steps; run 2 reached the reference's state at step 4 and stopped, so the
    composite's entries of steps 5-8 are the reference's (their run index is 2: one past the cell's runs)."""
    reference = [[s, s, 0, 0] for s in range(1, 9)]
    composite = [[s, s, 0, 0] for s in (1, 2)] + [[s, s, 0, 1] for s in (3, 4)] + [[s, s, 0, 2] for s in range(5, 9)]
    return {"target": "t", "case": {}, "case_id": "c", "resume_mode": "auto", "kill": "ckpt2",
            "kills": [KillSpec(2).to_json()], "passed": False, "xfail_reason": None, "categories": ["LOST"],
            "headline": "LOST: planted", "resumed_from": [2], "reference": reference, "composite": composite,
            "story": "", "runs": runs}


def test_the_reference_rest_after_an_early_stop_is_not_a_third_run():
    runs = [{"outcome": "killed"}, {"outcome": "converged", "converged_step": 4}]
    assert html.timeline(early_stopped_cell(runs))["labels"] == [
        "run 1", "run 2", "reference (after the early stop at step 4)"]


def test_a_json_file_without_the_early_stop_step_still_names_the_rest_the_reference():
    runs = [{"outcome": "killed"}, {"outcome": "converged"}]
    assert html.timeline(early_stopped_cell(runs))["labels"][2] == "reference (after the early stop at step 4)"


def test_a_converged_run_carries_its_early_stop_step_in_the_json():
    converged = record([ev.Event(ev.RESUMED, step=2), ev.Event(ev.CONVERGED, step=4)], Outcome.CONVERGED)
    assert report._run_json(converged)["converged_step"] == 4
    assert "converged_step" not in report._run_json(FIRST)


def test_the_page_script_names_runs_by_the_timeline_labels():
    script = (resources.files("pytest_resume_check.report") / "assets" / "report.js").read_text(encoding="utf-8")
    assert "runLabel(t, runs[st])" in script and "runLabel(t, run)" in script
    assert '"\\u2192 run " +' not in script  # no run number made up from a row's run index any more


def test_a_rerun_line_and_a_cell_name_never_break_inside():
    css = (resources.files("pytest_resume_check.report") / "assets" / "report.css").read_text(encoding="utf-8")
    rule = re.search(r"\.rerun code,[^{]*\{([^}]*)\}", css)
    assert rule and "white-space:nowrap" in rule.group(1) and "word-break:normal" in rule.group(1)
    assert "details.failure>summary code" in css and re.search(r"\.rerun\{overflow-x:auto", css)
    page = html.render([early_stopped_cell([{"outcome": "killed"}, {"outcome": "converged"}])], seed=1)
    assert "rerun: <code>pytest --resume-matrix --resume-matrix-seed=1 &#x27;--resume-matrix-cell=t[c-auto-ckpt2]" \
           "&#x27;</code>" in page


# -- a checkpoint's name and the step it holds ---------------------------------------------------

@pytest.mark.parametrize("step, path, label", [
    (6, "/ckpt/global_step_6", "resume from global_step_6"),
    (6, "/ckpt/step_6.pt", "resume from step_6.pt"),
    (6, "/out/checkpoints/checkpoint_5", "resume from checkpoint_5 (step 6)"),  # Accelerate counts saves from 0
    (6, "/out/latest", "resume from latest (step 6)"),
    (6, None, "resume from step 6"),
])
def test_a_folder_whose_name_does_not_say_its_step_is_labelled_with_it(step, path, label):
    assert vd.resume_label(step, path) == label


def test_a_stale_resume_names_each_step_once():
    saved = [(ev.Event(ev.STEP_END, step=s), ev.Event(ev.CHECKPOINT, step=s, path=f"/out/checkpoints/checkpoint_{s-1}"))
             for s in (1, 2)]
    first = record([e for pair in saved for e in pair], Outcome.KILLED, is_resume=False)
    stale = record([ev.Event(ev.RESUMED, step=1, path="/out/checkpoints/checkpoint_0")], Outcome.DONE)
    findings = vd.judge_restored([first, stale])
    assert [f.headline for f in findings] == [
        "STALE_RESUME: run 2 resumed from checkpoint_0 (step 1) but checkpoint_1 (step 2) was published before "
        "the kill: 1 step of training lost"]


def test_a_zero_change_programs_resume_counts_checkpoints_not_steps():
    # Its steps are the checkpoints it publishes: ckpt_4.pt is its second, not its step 2.
    assert vd.resume_label(2, "/out/ckpt_4.pt", "checkpoint") == "resume from ckpt_4.pt (checkpoint 2)"
    assert vd.resume_label(2, "/out/ckpt_4.pt") == "resume from ckpt_4.pt (step 2)"
    assert vd.resume_label(2, None, "checkpoint") == "resume from checkpoint 2"
