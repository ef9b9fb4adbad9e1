"""Report calls out of order, a runaway trainer and a full disk, each with real child runs: one clear
headline each (no torch)."""

from __future__ import annotations

import misbehaving_target as misbehaving
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.targets import resume_target

TARGET = resume_target(misbehaving.train, name="misbehaving", steps=misbehaving.STEPS)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("misbehaving"), seed=1, hang_timeout=30)


def judge(engine, case):
    return engine.run_cell(Cell(TARGET, case, "auto", (KillSpec(2),), misbehaving.STEPS)).verdict


def test_a_second_resumed_call_is_a_protocol_error_naming_the_call(engine):
    verdict = judge(engine, {"twice": True})
    assert verdict.categories == [vd.PROTOCOL]
    assert verdict.headline == ("PROTOCOL: run 2 of 2 called run.resumed(1) a second time (it first said step 2)")


def test_inputs_reported_after_their_step_end_are_a_protocol_error(engine):
    verdict = judge(engine, {"late": True})
    assert verdict.headline == ("PROTOCOL: run 2 of 2 called run.consumed(step=3) after run.step_end(3); report a "
                                "step's inputs before its step_end")


def test_a_run_that_goes_on_past_the_last_step_is_stopped_and_judged(engine):
    verdict = judge(engine, {"runaway": True})
    assert verdict.headline == ("PROTOCOL: run 2 of 2 went on past step 15, three times the case's steps: "
                                "stopped at the end of step 16 (a trainer that never stops)")


def test_a_full_disk_keeps_the_trainers_error_and_says_so(engine):
    verdict = judge(engine, {"enospc": True})
    assert verdict.categories == [vd.RESUME_ERROR]
    assert verdict.headline.startswith("RESUME_ERROR: run 2 raised while resuming: OSError: [Errno 28] No space "
                                       "left on device")
    assert verdict.headline.endswith(vd.DISK_FULL)


def test_the_same_target_without_a_broken_rule_passes(engine):
    assert judge(engine, {}).passed
