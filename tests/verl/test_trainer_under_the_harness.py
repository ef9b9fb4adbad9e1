"""The Agent Lightning trainer driven by the harness: real child processes, SIGKILL, resume.

The fixed async trainer passes; with the fix switched off the buffered tail is LOST; stock verl
replays epoch 0's order after a resume from an epoch-end checkpoint.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")
pytest.importorskip("verl")

from agentlightning.verl import resume_target as rt  # noqa: E402
from pytest_resume_check import verdict as vd  # noqa: E402
from pytest_resume_check.matrix import Cell  # noqa: E402
from pytest_resume_check.run import KillSpec, RunContext  # noqa: E402
from pytest_resume_check.scenario import Engine  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

CASE = {"id": "b4-r6-e2", "refill": 6}  # 6 inputs per step from batches of 4: a tail of 2 after step 1


def fit_async_unfixed(run: RunContext) -> None:
    """The async trainer with the input file switched off (the behaviour before the fix)."""
    from agentlightning.verl.trainer import AgentLightningRayPPOTrainer

    AgentLightningRayPPOTrainer.write_input_checkpoint = False  # this child process only
    rt.fit_async(run)


unfixed = resume_target(fit_async_unfixed, name="unfixed", steps=rt.async_steps, cases=[CASE],
                        preload=rt.PRELOAD)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("al"), seed=0, hang_timeout=60)


def run(engine, target, case, *kills, mode="auto"):
    return engine.run_cell(Cell(target, case, mode, tuple(kills), int(target.steps(case))))


@pytest.mark.parametrize("mode", ["auto", "path"])
def test_fixed_async_trainer_resumes_exactly_after_a_kill_with_a_buffered_tail(engine, mode):
    result = run(engine, rt.agentlightning_async, CASE, KillSpec(1), mode=mode)
    assert result.passed, result.verdict.headline
    assert result.runs[1].resumed_step == 1


def test_unfixed_async_trainer_loses_the_buffered_tail(engine):
    result = run(engine, unfixed, CASE, KillSpec(1))
    assert result.verdict.categories == [vd.LOST]
    assert result.verdict.headline.startswith("LOST 2 inputs after resume from global_step_1: ids 6, 7")


def test_fixed_async_trainer_survives_two_kills_across_the_epoch_boundary(engine):
    result = run(engine, rt.agentlightning_async, CASE, KillSpec(3), KillSpec(5, 1))
    assert result.passed, result.verdict.headline
    assert result.verdict.resumed_from == [3, 5]


def test_stock_verl_replays_epoch_zero_order_after_an_epoch_end_checkpoint(engine):
    case = rt.SYNC_CASES[1]  # shuffled, 4 steps per epoch
    result = run(engine, rt.verl_stock_sync, case, KillSpec(4))
    assert result.verdict.categories == [vd.REORDERED]
    ours = run(engine, rt.agentlightning_sync, case, KillSpec(4))
    assert ours.passed, ours.verdict.headline
