"""Double kills blame each resume for its own damage, in real double-kill cells through the engine: a
torch-free trainer whose two resumes each take an input again, and the planted torchdata trainer whose
second resume replays its epoch (the verdict's grouping itself: tests/unit/test_double_kill_blame.py)."""

from __future__ import annotations

import pytest
from optional import requires

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.targets import resume_target


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from pytest_resume_check.engine import Engine

    eng = Engine(tmp_path_factory.mktemp("double-kill"), seed=5, hang_timeout=60)
    yield eng
    eng.close()


def test_a_real_double_kill_where_both_resumes_take_inputs_again_names_each(engine):
    import step_logger_target as logger

    target = resume_target(logger.train, name="step_logger", steps=logger.STEPS)
    result = engine.run_cell(Cell(target, {"id": "replay12", "replay": [1, 2]}, "auto",
                                  (KillSpec(2), KillSpec(5)), logger.STEPS))
    assert result.verdict.resumed_from == [2, 5]
    assert result.verdict.categories == [vd.DUPLICATED]
    assert result.verdict.headline == ("DUPLICATED 1 input after resume from step_2: ids 2 (epoch 0); "
                                       "1 input after resume from step_5: ids 5 (epoch 0)")


@requires("torch", "torchdata")
def test_the_planted_trainer_whose_second_resume_replays_its_epoch_blames_the_second_resume(engine):
    """torchdata 0.11 (``loop_loader_state_at_save``, docs/examples/planted): the checkpoint the first resumed
    run writes right after resuming from an odd step reads as the start of the epoch, so the second
    resume replays epoch 0; the first resume took nothing twice."""
    from pytest_resume_check.builtin import loop

    target = resume_target(loop.loop_loader_state_at_save, name="torchdata_sampler", steps=loop.total_steps,
                           boundaries=loop.epoch_boundaries, preload=loop.PRELOAD)
    case = {"id": "b4-take2", "n": 8, "batch": 4, "take": 2}
    result = engine.run_cell(Cell(target, case, "auto", (KillSpec(1), KillSpec(2, 1)), loop.total_steps(case)))
    assert result.verdict.resumed_from == [1, 2]
    assert [f.headline for f in result.verdict.findings if f.category in (vd.LOST, vd.DUPLICATED)] == [
        "LOST 4 inputs after resume from step_2: ids 4, 5, 6, 7 (epoch 1)",
        "DUPLICATED 4 inputs after resume from step_2: ids 0, 1, 2, 3 (epoch 0)"]
