"""The early stop never hides a difference: a resumed run whose state equals the reference's at an epoch's
end stops only once it also takes the reference's next inputs next, so a replay still pending (an epoch
longer than the reference's) runs on and shows.

The trainer is ``chunked_stream_target`` (stdlib; a stream read three batches ahead, two epochs of six
steps). Its planted bug ``rounded`` rounds the stream's checkpointed position down to a chunk of four
batches: a resume from step 5 (the queue holds batch 5, the stream is at batch 6, saved as 4) trains batch 5
at step 6 like the uninterrupted run, reaches the epoch's end with the same state, and would read batches
4 and 5 again after it. Quick mode (shared first runs, early stop) and exhaustive mode (``share=False``)
must give that cell the same verdict, word for word, and the correct trainer still stops early.
"""

from __future__ import annotations

import chunked_stream_target as trainer
import pytest

from pytest_resume_check.cells.matrix import FULL, cells
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.targets import resume_target

SEED = 3
TARGETS = {fn.__name__: resume_target(fn, name=fn.__name__, steps=trainer.total_steps,
                                      boundaries=trainer.epoch_boundaries, auto_preload=False)
           for fn in (trainer.correct, trainer.rounded)}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("quick"), seed=SEED)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("exhaustive"), seed=SEED, share=False)
    yield engine
    engine.close()


def judge_all(engine, name):
    chosen = cells(TARGETS[name], FULL, SEED)
    engine.register(chosen)
    return {cell.id: engine.run_cell(cell) for cell in chosen}


def words(results):
    return {cell_id: (r.verdict.categories, r.verdict.headline) for cell_id, r in results.items()}


def test_a_replay_pending_at_the_epochs_end_is_not_hidden_by_the_early_stop(quick, exhaustive):
    fast, slow = judge_all(quick, "rounded"), judge_all(exhaustive, "rounded")
    assert words(fast) == words(slow)
    cell = "default-auto-ckpt5"
    assert fast[cell].verdict.categories == [vd.DUPLICATED], fast[cell].verdict.headline
    assert fast[cell].verdict.headline == (
        "DUPLICATED 4 inputs after resume from step_5: ids 8, 9, 10, 11 (epoch 0)")
    # The resumed run reached the reference's state at step 6 and was not stopped: it took batch 4 next.
    assert fast[cell].runs[-1].outcome == Outcome.DONE and fast[cell].runs[-1].last_step == 14


def test_the_correct_trainer_still_stops_at_the_epochs_end(quick, exhaustive):
    fast, slow = judge_all(quick, "correct"), judge_all(exhaustive, "correct")
    assert all(r.passed for r in fast.values()) and all(r.passed for r in slow.values())
    stopped = {cell_id: r.runs[-1].converged_step for cell_id, r in fast.items()
               if r.runs[-1].outcome == Outcome.CONVERGED}
    assert stopped and set(stopped.values()) == {trainer.PER_EPOCH}, stopped
    assert stopped["default-auto-ckpt5"] == trainer.PER_EPOCH
