"""A hung run's headline names the file that holds its processes' stacks (the run's log, kept with the cell):
every rank's, some ranks', or the one process's; and says nothing of stacks that were not written. Records
made here; no processes."""

from __future__ import annotations

import pytest

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.targets import Contract

LOG = "/kept/cell/reference/run0.log"
SILENT = "HUNG: the reference run sent no event for 60 s after step 2; it was killed"


def hung(dumps, world_size=2):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", LOG, world_size=world_size)
    events = [ev.Event(ev.STEP_END, step=step) for step in (1, 2)]
    return RunRecord(plan, events, Outcome.HUNG, None, hang_timeout=60.0, stack_dumps=dumps)


def headline(record):
    (finding,) = vd.judge_reference(record, None, None, Contract())
    assert finding.category == vd.HUNG
    return finding.headline


@pytest.mark.parametrize("dumps, world_size, end", [
    ([(None, True)], 1, vd.MSG_HUNG_STACK.format(path=LOG)),
    ([(0, True), (1, True)], 2, vd.MSG_HUNG_STACKS.format(path=LOG)),
    ([(0, False), (1, True)], 2, vd.MSG_HUNG_STACKS_OF.format(ranks="rank 1", path=LOG)),
    ([(0, True), (1, False), (2, True)], 3, vd.MSG_HUNG_STACKS_OF.format(ranks="ranks 0, 2", path=LOG)),
])
def test_a_hung_runs_headline_ends_with_the_file_that_holds_its_stacks(dumps, world_size, end):
    assert headline(hung(dumps, world_size)) == SILENT + end


@pytest.mark.parametrize("dumps", [[], [(None, False)], [(0, False), (1, False)]])
def test_a_hung_run_that_wrote_no_stacks_names_no_file(dumps):
    assert headline(hung(dumps)) == SILENT


def test_the_stacks_come_after_what_the_run_was_waited_for():
    record = hung([(0, True), (1, True)])
    record.stalled = "rank 1 did not report the end of step 3"
    assert headline(record) == ("HUNG: the reference run: rank 1 did not report the end of step 3; it was killed"
                                + vd.MSG_HUNG_STACKS.format(path=LOG))
