"""State verdicts with real child processes and no torch: exact digests, the early stop, a tolerance."""

from __future__ import annotations

import plain_state_target as plain
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.targets import resume_target

KILLS = [(KillSpec(2),), (KillSpec(4, 1),), (KillSpec(1), KillSpec(3))]


def target(name="plain", **kw):
    return resume_target(plain.train, name=name, steps=plain.STEPS, **kw)


def judge(engine, t, case, kills, mode="auto"):
    return engine.run_cell(Cell(t, case, mode, kills, plain.STEPS))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("state"), seed=3, hang_timeout=30)


@pytest.mark.parametrize("mode", ["auto", "path"])
@pytest.mark.parametrize("kills", KILLS, ids=lambda k: ",".join(map(str, (s.kill_step for s in k))))
def test_a_correct_resume_of_a_complete_state_stops_at_its_first_step_with_the_references_state(engine, kills, mode):
    result = judge(engine, target("plain_any", early_stop="any"), {}, kills, mode)
    assert result.passed, result.verdict.headline
    last = result.runs[-1]
    assert last.outcome == Outcome.CONVERGED and last.converged_step == last.resumed_step + 1


@pytest.mark.parametrize("kills", KILLS, ids=lambda k: ",".join(map(str, (s.kill_step for s in k))))
def test_by_default_a_resume_in_an_epoch_that_never_ends_before_the_last_step_runs_to_the_end(engine, kills):
    result = judge(engine, target(), {}, kills)  # one epoch: no step ends an epoch before the last
    assert result.passed, result.verdict.headline
    assert result.runs[-1].outcome == Outcome.DONE


def test_never_stops_early_when_the_target_says_never(engine):
    result = judge(engine, target("plain_never", early_stop="never"), {}, (KillSpec(2),))
    assert result.passed and result.runs[-1].outcome == Outcome.DONE


def test_a_state_that_never_meets_the_reference_is_judged_at_the_restored_step(engine):
    result = judge(engine, target("plain_any", early_stop="any"), {"nudge": True}, (KillSpec(2),))
    assert result.runs[-1].outcome == Outcome.DONE
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline == vd.MSG_STATE_DIVERGED.format(
        step="step 2", when="the restored step of", label="resume from step_2",
        what="model differs (w), progress agrees")


def test_a_restore_at_the_last_step_is_judged_like_any_other(engine):
    result = judge(engine, target(), {"nudge": True}, (KillSpec(plain.STEPS),))
    assert result.verdict.categories == [vd.STATE_DIVERGED], result.verdict.headline
    assert result.verdict.headline.startswith(f"STATE_DIVERGED at step {plain.STEPS} (the restored step of ")


def test_the_early_stop_and_full_runs_give_the_same_verdicts(tmp_path, engine):
    full = Engine(tmp_path, seed=3, hang_timeout=30, share=False)
    for case in ({}, {"nudge": True}):
        for kills in KILLS:
            quick = target("plain_any", early_stop="any")
            fast, slow = judge(engine, quick, case, kills), judge(full, quick, case, kills)
            assert (fast.verdict.categories, fast.verdict.headline) == (slow.verdict.categories, slow.verdict.headline)
            assert slow.runs[-1].outcome == Outcome.DONE


def test_state_noise_between_reference_runs_is_nondeterministic_naming_the_component(engine):
    result = judge(engine, target(), {"jitter": True}, (KillSpec(2),))
    assert result.verdict.categories == [vd.NONDETERMINISTIC]
    assert result.verdict.headline.startswith("NONDETERMINISTIC reference: two uninterrupted runs differ in their "
                                              "state from step 1: model differs (w), progress agrees;")


def test_a_tolerance_accepts_the_noise_and_still_catches_a_real_difference(engine):
    tolerant = target("plain_tolerant", state_tolerance=(0.0, 1e-6))  # references are cached by name
    for kills in KILLS:
        assert judge(engine, tolerant, {"jitter": True}, kills).passed
    result = judge(engine, tolerant, {"jitter": True, "nudge": True}, (KillSpec(4, 1),))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 4 (the restored step of resume from step_4): "
                                              "model differs (w), progress agrees")
    assert result.runs[-1].outcome == Outcome.DONE  # close is not equal: no early stop under a tolerance
