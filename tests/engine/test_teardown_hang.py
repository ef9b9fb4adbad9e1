"""How a two-rank gloo run ends: a correct loop does not hang at its end under the harness (as it does not under
``torchrun``), and a trainer's own hang names the file that holds every rank's stack.

The teardown race is torch's (gloo joins its worker threads with the GIL held when a process group is destroyed,
and a worker thread still dropping a finished all-reduce may need the GIL); it used to meet correct loops at
exit about one run in ten, and only under the harness, whose preloaded processes let the default group die
with the trainer's model (``child.process_groups``). ``teardown_targets.gil_needed_at_return`` makes its
hanging order certain instead of waiting for a loaded machine to deal it. Real processes, real gloo.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

import teardown_targets as targets  # noqa: E402

from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import kill_ids  # noqa: E402
from pytest_resume_check.records.results import Outcome  # noqa: E402
from pytest_resume_check.report import text as rp  # noqa: E402

#: Enough for a run of a few steps on a loaded machine; a run that deadlocks never ends at all.
HANG_LIMIT = 30


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("teardown"), seed=3, hang_timeout=HANG_LIMIT)
    yield eng
    eng.close()


@pytest.mark.parametrize("target", [targets.gil_at_return, targets.gil_at_return_torchrun], ids=lambda t: t.launcher)
def test_a_gloo_thread_that_needs_the_gil_when_the_trainer_returns_does_not_hang_the_run(engine, target, tmp_path):
    plan = engine.runner.plan(target, target.cases[0], tmp_path, 0)
    record = engine.runner.run(plan, target)
    assert record.outcome == Outcome.DONE, (record.outcome, record.error)
    assert record.leftovers == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(record.pid, 0)


def test_a_rank_waiting_in_a_collective_nobody_joins_is_hung_and_its_headline_names_every_ranks_stack(engine):
    target = targets.collective_nobody_joins
    case = target.cases[0]
    result = engine.run_cell(Cell(target, case, "auto", kill_ids.parse_kill_id("ckpt1"), targets.STEPS))
    assert result.verdict.categories == [vd.HUNG]
    reference = result.reference
    assert reference.outcome == Outcome.HUNG
    assert reference.stack_dumps == [(0, True), (1, True)]
    log = reference.plan.log_path
    assert result.verdict.headline.endswith(vd.MSG_HUNG_STACKS.format(path=log))
    where = {proc["rank"]: [frame["function"] for thread in proc["threads"] for frame in thread["frames"]]
             for proc in rp.stacks(log)}
    assert "all_reduce" in where[0] and "waits_in_a_collective_nobody_joins" in where[0]
    assert "wait_for_something_else_forever" in where[1]
