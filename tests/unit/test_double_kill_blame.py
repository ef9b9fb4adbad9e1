"""Double kills blame each resume for its own damage: in a cell killed twice (run 1 killed, run 2 resumes
and is killed, run 3 resumes), inputs the second resume took again or never took name the second resume,
also when the first resume did damage of its own. Ledgers and run records built here; real double-kill
cells in tests/engine/test_double_kill_cells.py."""

from __future__ import annotations

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.targets import Contract

STEPS = 8
FIRST, SECOND = "resume from step_2", "resume from step_5"


def step(n, *ids, epoch=0):
    """The events of step ``n`` that took ``ids`` (each id is its step in the reference)."""
    out = [ev.Event(ev.CONSUMED, step=n, epoch=epoch, ids=ids)] if ids else []
    return [*out, ev.Event(ev.STEP_END, step=n)]


def record(events, outcome, is_resume=False, kill=None):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", is_resume=is_resume, kill=kill)
    return RunRecord(plan, list(events), outcome, 0, None)


def cell(second_run, third_run):
    """The reference (id ``s`` at step ``s``) and a double kill: run 1 killed right after the checkpoint
    of step 2, run 2 (``second_run``: step -> ids, from step 3) killed right after that of step 5, run 3
    (``third_run``, from step 6) to the end. A step missing from a mapping takes its reference id."""
    reference = record([e for s in range(1, STEPS + 1) for e in step(s, s)], Outcome.DONE)
    first = record([*step(1, 1), *step(2, 2), ev.Event(ev.CHECKPOINT, step=2, path="/ckpt/step_2")],
                   Outcome.KILLED, kill=KillSpec(2))
    second = record([ev.Event(ev.RESUMED, step=2, path="/ckpt/step_2"),
                     *[e for s in (3, 4, 5) for e in step(s, *second_run.get(s, (s,)))],
                     ev.Event(ev.CHECKPOINT, step=5, path="/ckpt/step_5")], Outcome.KILLED, True, KillSpec(5))
    third = record([ev.Event(ev.RESUMED, step=5, path="/ckpt/step_5"),
                    *[e for s in range(6, STEPS + 1) for e in step(s, *third_run.get(s, (s,)))]], Outcome.DONE, True)
    return vd.judge(reference, [first, second, third], Contract())


def test_only_the_second_resume_took_inputs_again_so_only_it_is_named():
    verdict = cell({}, {6: (5, 6)})  # run 3 takes id 5 again (run 2 took it at step 5)
    assert verdict.resume_labels == [FIRST, SECOND]
    assert verdict.categories == [vd.DUPLICATED]
    assert verdict.headline == vd.MSG_DUPLICATED.format(n=1, s="", where=SECOND, ids="5", epochs="epoch 0")
    assert FIRST not in verdict.headline


def test_both_resumes_took_inputs_again_and_each_is_named_with_its_own_ids():
    verdict = cell({3: (1, 2, 3)}, {6: (5, 6), 7: (4, 7)})
    assert verdict.categories == [vd.DUPLICATED]
    assert verdict.headline == ("DUPLICATED 2 inputs after resume from step_2: ids 1, 2 (epoch 0); "
                                "2 inputs after resume from step_5: ids 5, 4 (epoch 0)")
    finding = verdict.findings[0]
    assert finding.ids == (1, 2, 5, 4) and finding.step == 3  # every id, and where the first was taken again


def test_the_same_id_taken_again_by_both_resumes_is_listed_under_each():
    verdict = cell({3: (2, 3)}, {6: (2, 6)})
    assert verdict.headline == ("DUPLICATED 1 input after resume from step_2: ids 2 (epoch 0); "
                                "1 input after resume from step_5: ids 2 (epoch 0)")
    assert verdict.findings[0].ids == (2,)


def test_inputs_the_second_resume_never_took_name_the_second_resume():
    verdict = cell({}, {6: (), 7: ()})  # run 3 skips ids 6 and 7
    assert verdict.categories == [vd.LOST]
    assert verdict.headline == vd.MSG_LOST.format(n=2, s="s", where=SECOND, ids="6, 7", epochs="epoch 0")


def test_inputs_each_resume_never_took_are_blamed_on_each():
    verdict = cell({3: ()}, {6: ()})
    assert verdict.categories == [vd.LOST]
    assert verdict.headline == ("LOST 1 input after resume from step_2: ids 3 (epoch 0); "
                                "1 input after resume from step_5: ids 6 (epoch 0)")
    assert verdict.findings[0].step == 3


def test_resumes_with_the_same_label_are_told_apart_by_their_run():
    ref = [ev.Event(ev.CONSUMED, step=s, epoch=0, ids=(s,)) for s in range(1, 7)]
    first = [ev.Event(ev.CONSUMED, step=s, epoch=0, ids=(s,)) for s in (1, 2)]
    second = [ev.Event(ev.RESUMED, step=2), *[ev.Event(ev.CONSUMED, step=s, epoch=0, ids=ids)
                                              for s, ids in ((3, (2, 3)), (4, (4,)))]]
    third = [ev.Event(ev.RESUMED, step=4), *[ev.Event(ev.CONSUMED, step=s, epoch=0, ids=ids)
                                             for s, ids in ((5, (4, 5)), (6, (6,)))]]
    comp, resumed_from = vd.compose([first, second, third])
    labels = ["resume from last.ckpt", "resume from last.ckpt"]  # a trainer that overwrites one file
    findings = vd.compare(vd.Ledger.from_events(ref), comp, True, labels=labels, resumed_from=resumed_from)
    assert [f.headline for f in findings] == [
        "DUPLICATED 1 input after resume from last.ckpt (run 2): ids 2 (epoch 0); "
        "1 input after resume from last.ckpt (run 3): ids 4 (epoch 0)"]


def test_one_resume_keeps_the_headline_it_always_had():
    ref = [ev.Event(ev.CONSUMED, step=s, epoch=0, ids=(s,)) for s in range(1, 5)]
    runs = [[ev.Event(ev.CONSUMED, step=1, epoch=0, ids=(1,))],
            [ev.Event(ev.RESUMED, step=1), *[ev.Event(ev.CONSUMED, step=s, epoch=0, ids=ids)
                                             for s, ids in ((2, (1, 1, 2)), (3, ()), (4, (4,)))]]]
    comp, resumed_from = vd.compose(runs)
    findings = vd.compare(vd.Ledger.from_events(ref), comp, True, labels=["resume from step 1"],
                          resumed_from=resumed_from)
    assert [f.headline for f in findings] == [
        "LOST 1 input after resume from step 1: ids 3 (epoch 0)",
        "DUPLICATED 1 input after resume from step 1: ids 1 (epoch 0); 2 occurrences in all"]
