"""Hand-written resume tests: one kill scenario each, spelled out, with the ``resume_check`` fixture.

Each test runs the trainer uninterrupted (the reference), then runs it again, SIGKILLs it at the
given points, resumes it from what is on disk, and compares the inputs the two consumed.
"""

from __future__ import annotations

SHUFFLE = {"id": "e2-shuffle", "epochs": 2, "shuffle": True}
EVERY_INPUT_TWICE = sorted(list(range(10)) * 2)


def test_kill_after_the_first_checkpoint_of_epoch_1_resumes_exactly(resume_check, regression_target):
    # Step 4 takes the first batch of epoch 1 (three steps per epoch).
    result = resume_check.run(regression_target, case=SHUFFLE, kills=resume_check.kill_after_checkpoint(4))
    assert result.passed, resume_check.report(result)

    composite = result.verdict.composite  # what the interrupted job as a whole consumed
    assert composite.ids == result.verdict.reference.ids
    assert sorted(composite.ids) == EVERY_INPUT_TWICE
    assert result.verdict.resumed_from == [4]
    # The killed run contributed steps 1-4 (10 + 4 inputs), the resumed run the remaining 6.
    assert [e.run for e in composite] == [0] * 14 + [1] * 6
    assert [e.epoch for e in composite] == [0] * 10 + [1] * 10


def test_two_kills_with_unsaved_work_lose_and_repeat_nothing(resume_check, regression_target):
    kills = [
        resume_check.kill_after_checkpoint(2),  # first run: killed right after checkpoint 2
        resume_check.kill_after_checkpoint(3, extra_steps=2),  # second run: steps 4-5 never saved
    ]
    result = resume_check.run(regression_target, case=SHUFFLE, kills=kills)
    assert result.passed, resume_check.report(result)
    assert result.verdict.resumed_from == [2, 3]
    assert result.verdict.composite.ids == result.verdict.reference.ids
    assert sorted(result.verdict.composite.ids) == EVERY_INPUT_TWICE


def test_kill_before_any_checkpoint_restarts_from_scratch(resume_check, regression_target):
    result = resume_check.run(regression_target, kills=resume_check.kill_after_checkpoint(0, extra_steps=2))
    assert result.passed, resume_check.report(result)
    assert result.verdict.resumed_from == [0]
    assert {e.run for e in result.verdict.composite} == {1}  # nothing of the killed run counts
