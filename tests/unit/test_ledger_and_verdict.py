"""Pure tests of composite ledgers and verdict classification (no processes, no torch)."""

from __future__ import annotations

import json
import re

import pytest

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.ledger import Ledger, ResumeReportMissing, compose
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.targets import Contract


def consumed(step, epoch, *ids):
    return ev.Event(ev.CONSUMED, step=step, epoch=epoch, ids=ids)


def resumed(step, path=None):
    return ev.Event(ev.RESUMED, step=step, path=path)


def stream(pairs):
    """[(step, epoch, ids...)] -> events"""
    return [consumed(*p) for p in pairs]


REFERENCE = stream([(1, 0, 0, 1), (2, 0, 2, 3), (3, 1, 0, 1), (4, 1, 2, 3)])


def ledger(events):
    return Ledger.from_events(events)


def test_composite_keeps_first_run_up_to_the_resumed_checkpoint_only():
    first = stream([(1, 0, 0, 1), (2, 0, 2, 3), (3, 1, 9, 9)])  # step 3 was never saved
    second = [resumed(2), *stream([(3, 1, 0, 1), (4, 1, 2, 3)])]
    composite, resumed_from = compose([first, second])
    assert resumed_from == [2]
    assert composite.ids == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [e.run for e in composite] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_composite_of_a_restart_from_scratch_drops_the_first_run():
    first = stream([(1, 0, 0, 1)])
    second = [resumed(0), *REFERENCE]
    composite, _ = compose([first, second])
    assert composite.ids == ledger(REFERENCE).ids


def test_composite_of_two_kills_cuts_at_each_resume():
    first = stream([(1, 0, 0, 1), (2, 0, 2, 3)])
    second = [resumed(1), *stream([(2, 0, 2, 3), (3, 1, 0, 1)])]
    third = [resumed(3), *stream([(4, 1, 2, 3)])]
    composite, resumed_from = compose([first, second, third])
    assert resumed_from == [1, 3]
    assert composite.ids == [0, 1, 2, 3, 0, 1, 2, 3]


def test_a_resumed_run_that_never_reports_its_checkpoint_is_a_protocol_error():
    with pytest.raises(ResumeReportMissing, match="run.resumed"):
        compose([REFERENCE, stream([(1, 0, 0)])])


@pytest.mark.parametrize(
    ("composite", "categories"),
    [
        pytest.param(REFERENCE, [], id="identical"),
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 2), (3, 1, 0, 1), (4, 1, 2, 3)]), [vd.LOST], id="lost"),
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 2, 3, 3), (3, 1, 0, 1), (4, 1, 2, 3)]), [vd.DUPLICATED],
                     id="duplicated"),
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 2, 3), (3, 1, 0, 1), (4, 2, 2, 3)]), [vd.EPOCH], id="epoch"),
        # The reference's inputs in the reference's places, under another epoch number: only the label differs.
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 2, 3), (3, 0, 0, 1), (4, 0, 2, 3)]), [vd.EPOCH],
                     id="epoch-counter"),
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 3, 2), (3, 1, 0, 1), (4, 1, 2, 3)]), [vd.REORDERED],
                     id="reordered"),
        pytest.param(stream([(1, 0, 0, 1), (2, 0, 0, 1), (3, 1, 0, 1), (4, 1, 2, 3)]),
                     [vd.LOST, vd.DUPLICATED], id="fresh-permutation"),
    ],
)
def test_compare_classifies_each_kind_of_difference(composite, categories):
    findings = vd.compare(ledger(REFERENCE), ledger(composite), ordered=True)
    assert [f.category for f in findings] == categories


def test_unordered_contract_accepts_another_order_but_not_a_loss():
    swapped = stream([(1, 0, 1, 0), (2, 0, 2, 3), (3, 1, 0, 1), (4, 1, 3, 2)])
    assert vd.compare(ledger(REFERENCE), ledger(swapped), ordered=False) == []
    short = stream([(1, 0, 1, 0), (2, 0, 2, 3), (3, 1, 0, 1), (4, 1, 3)])
    assert [f.category for f in vd.compare(ledger(REFERENCE), ledger(short), ordered=False)] == [vd.LOST]


def test_lost_headline_names_count_ids_epoch_and_resume_point():
    first = stream([(1, 0, 0, 1), (2, 0, 2, 3)])
    second = [resumed(3, "/ckpt/global_step_3"), *stream([(4, 1, 3)])]
    reference = stream([(1, 0, 0, 1), (2, 0, 2, 3), (3, 1, 0, 1), (4, 1, 2, 3)])
    first = [*first, *stream([(3, 1, 0, 1)])]
    comp, _ = compose([first, second])
    findings = vd.compare(ledger(reference), comp, True, labels=["resume from global_step_3"], resumed_from=[3])
    assert findings[0].headline == vd.MSG_LOST.format(
        n=1, s="", where="resume from global_step_3", ids="2", epochs="epoch 1")
    assert findings[0].headline == "LOST 1 input after resume from global_step_3: ids 2 (epoch 1)"


def _record(events, outcome, is_resume=False, error=None):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/tmp/x", "/tmp/x.log", is_resume=is_resume,
                   kill=KillSpec(1) if outcome == Outcome.KILLED else None)
    return RunRecord(plan, list(events), outcome, 0, error)


def test_a_resumed_run_that_raised_is_a_resume_error_with_its_last_traceback_line():
    ref = _record(REFERENCE, Outcome.DONE)
    runs = [_record(REFERENCE[:1], Outcome.KILLED),
            _record([], Outcome.RAISED, True, "Traceback...\nValueError: bad file")]
    verdict = vd.judge(ref, runs, Contract())
    assert verdict.categories == [vd.RESUME_ERROR]
    assert verdict.headline.endswith("ValueError: bad file")


def test_a_first_run_that_raised_is_a_crash_not_a_resume_error():
    runs = [_record([], Outcome.RAISED, False, "boom")]
    assert vd.judge(_record(REFERENCE, Outcome.DONE), runs, Contract()).categories == [vd.CRASHED]


def test_differing_reference_runs_are_reported_as_nondeterministic():
    other = stream([(1, 0, 1, 0), (2, 0, 2, 3), (3, 1, 0, 1), (4, 1, 2, 3)])
    findings = vd.judge_reference(_record(REFERENCE, Outcome.DONE), _record(other, Outcome.DONE), None, Contract())
    assert [f.category for f in findings] == [vd.NONDETERMINISTIC]


def test_a_reference_with_other_step_count_than_declared_is_a_protocol_error():
    events = [*REFERENCE, ev.Event(ev.STEP_END, step=4)]
    findings = vd.judge_reference(_record(events, Outcome.DONE), None, 6, Contract())
    assert findings[0].headline == vd.MSG_STEPS.format(declared=6, actual=4)


def test_events_survive_the_wire_format():
    e = ev.Event(ev.CONSUMED, step=3, epoch=1, ids=(1, "a", (2, 3)))
    assert ev.Event.from_wire(e.to_wire()) == e


def test_unknown_event_kind_on_the_wire_is_rejected():
    with pytest.raises(ValueError, match="unknown event kind"):
        ev.Event.from_wire(b'{"kind": "nonsense"}')


@pytest.mark.parametrize(("composite", "ref_marks", "comp_marks"), [
    ([[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 0, 0], [3, 2, 0, 0]], "....", "...."),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [3, 2, 0, 1], [2, 2, 0, 1]], "....", "..RR"),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 1, 1], [3, 2, 0, 1]], "..E.", "..E."),
    ([[0, 1, 0, 0], [1, 1, 0, 0], [1, 2, 0, 1], [3, 2, 0, 1]], "..L.", "..D."),
])
def test_entry_marks_mark_each_entry_as_the_verdict_counts_it(composite, ref_marks, comp_marks):
    """Per-entry marks of the JSON report and the HTML timelines, on ledger rows ``[id, step, epoch, run]``."""
    reference = [[0, 1, 0, 0], [1, 1, 0, 0], [2, 2, 0, 0], [3, 2, 0, 0]]
    assert vd.entry_marks(reference, composite) == (ref_marks, comp_marks)
    marks = {vd.MARK_OK, vd.MARK_LOST, vd.MARK_DUPLICATED, vd.MARK_REORDERED, vd.MARK_EPOCH}
    assert marks >= set(ref_marks + comp_marks)


def test_an_epoch_replayed_from_its_start_reads_as_lost_and_duplicated_not_as_labels():
    """Resumed one step into epoch 1, the run replays epoch 0 from its start under label 0 and so
    never reaches the end of epoch 1. Matching ids alone called it 'EPOCH labels differ'; the inputs
    themselves differ (other ids stand in those places), and the headline says so."""
    reference = [*[(s, 0, *range(4 * s - 4, 4 * s)) for s in (1, 2, 3)],
                 *[(s, 1, *range(4 * s - 16, 4 * s - 12)) for s in (4, 5, 6)]]
    first = stream(reference[:4])
    second = [resumed(4, "/ckpt/step_4"), *stream([(5, 0, 0, 1, 2, 3), (6, 0, 4, 5, 6, 7)])]
    comp, resumed_from = compose([first, second])
    findings = vd.compare(ledger(stream(reference)), comp, True, labels=["resume from step_4"],
                          resumed_from=resumed_from)
    assert [f.category for f in findings] == [vd.LOST, vd.DUPLICATED]
    assert findings[0].headline == "LOST 8 inputs after resume from step_4: ids 4, 5, 6, 7, 8, 9, 10, 11 (epoch 1)"
    assert findings[1].headline == "DUPLICATED 8 inputs after resume from step_4: ids 0, 1, 2, 3, 4, 5, 6, 7 (epoch 0)"


def test_a_shuffled_replay_that_puts_an_id_back_in_its_place_is_not_an_epoch_label():
    reference = stream([(1, 0, 0, 1, 2, 3), (2, 1, 2, 0, 3, 1)])
    comp = stream([(1, 0, 0, 1, 2, 3), (2, 0, 1, 0, 3, 2)])  # epoch 0 again; ids 0 and 3 land where epoch 1 has them
    assert [f.category for f in vd.compare(ledger(reference), ledger(comp), True)] == [vd.LOST, vd.DUPLICATED]
    rows = lambda events: ledger(events).to_json()  # noqa: E731
    assert vd.entry_marks(rows(reference), rows(comp)) == ("....LLLL", "....DDDD")


def test_a_double_kill_names_the_resume_that_took_inputs_again():
    """The second resume re-takes id 4, which the first resumed run took (correctly) at step 4.
    The headline names the second resume, whose run diverges, not the first."""
    first = stream([(1, 0, 1), (2, 0, 2)])
    second = [resumed(1, "/ckpt/step_1"), *stream([(2, 0, 2), (3, 0, 3), (4, 0, 4), (5, 0, 5)])]
    third = [resumed(4, "/ckpt/step_4"), *stream([(5, 0, 4, 5), (6, 0, 6)])]
    comp, resumed_from = compose([first, second, third])
    reference = stream([(s, 0, s) for s in range(1, 7)])
    findings = vd.compare(ledger(reference), comp, True, labels=["resume from step_1", "resume from step_4"],
                          resumed_from=resumed_from)
    assert [f.headline for f in findings] == ["DUPLICATED 1 input after resume from step_4: ids 4 (epoch 0)"]
    assert findings[0].step == 5  # where it was taken again


def test_a_run_outcome_reads_as_its_value_in_text_json_and_comparisons():
    """Outcomes are one enum, and everything that reads them (JSON, headlines, strings read
    back from JSON) still sees ``"killed"``."""
    killed = Outcome.KILLED
    assert (str(killed), f"{killed}", json.dumps({"outcome": killed})) == ("killed", "killed", '{"outcome": "killed"}')
    assert killed == "killed" and "killed" in {killed} and Outcome("killed") is killed
    assert _record([], "killed").outcome is killed  # a plain value becomes its member


def test_the_judge_takes_its_steps_in_the_order_its_docstring_gives():
    documented = re.findall(r"^\d\. ([A-Za-z/ ]+?)(?: \(final\))?:", vd.__doc__, re.MULTILINE)
    names = ["_" + name.lower().replace("/", "").replace(" ", "_") for name in documented]
    assert [step.__name__ for step in vd.STEPS] == names


def test_a_finished_run_judged_against_an_identical_reference_passes():
    first = [*REFERENCE[:2], ev.Event(ev.STEP_END, step=1), ev.Event(ev.STEP_END, step=2),
             ev.Event(ev.CHECKPOINT, step=2)]
    runs = [_record(first, Outcome.KILLED), _record([resumed(2), *REFERENCE[2:]], Outcome.DONE, is_resume=True)]
    verdict = vd.judge(_record(REFERENCE, Outcome.DONE), runs, Contract())
    assert verdict.findings == [] and verdict.resumed_from == [2] and verdict.resume_labels == ["resume from step 2"]


def test_a_killed_last_run_is_a_protocol_error():
    runs = [_record(REFERENCE[:2], Outcome.KILLED)]
    verdict = vd.judge(_record(REFERENCE, Outcome.DONE), runs, Contract())
    assert verdict.headline == vd.MSG_PROTOCOL.format(detail="the last run was killed")

