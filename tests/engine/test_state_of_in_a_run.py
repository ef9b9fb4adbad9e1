"""``run.state(step, state_of(trainer))`` in real runs: the walk finds an EMA model nobody
listed, so a checkpoint that forgets it fails at the restored step naming ``ema_model``, while the
correct trainer, whose object also holds a lock, a logger, the run context and its own output folder
(skipped), passes every cell of its full matrix. The trainer is ``walked_trainer``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import walked_trainer as trainer  # noqa: E402

from pytest_resume_check.cells.matrix import FULL, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

SEED = 3
# torch._dynamo too: the first optimizer step of a process imports it (seconds), paid once in the fork server.
PRELOAD = ("torch", "torch._dynamo")
TARGETS = {fn.__name__: resume_target(fn, name=fn.__name__, steps=trainer.total_steps, preload=PRELOAD)
           for fn in (trainer.correct, trainer.no_ema)}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("state-of"), seed=SEED)
    yield eng
    eng.close()


def judge_all(engine, name):
    chosen = cells(TARGETS[name], FULL, SEED)
    engine.register(chosen)
    return {cell.id: (cell, engine.run_cell(cell)) for cell in chosen}


def test_the_walked_state_of_the_correct_trainer_passes_every_cell(engine):
    results = judge_all(engine, "correct")
    assert len(results) > 10
    failing = {cell_id: r.verdict.headline for cell_id, (_, r) in results.items() if not r.passed}
    assert failing == {}


def test_an_ema_left_out_of_the_checkpoint_is_named_at_the_restored_step(engine):
    results = judge_all(engine, "no_ema")
    for cell_id, (cell, result) in results.items():
        restored = [kill.checkpoint_step for kill in cell.kills]
        first = next((k for k in restored if k > 0), None)  # every step moves the EMA
        if first is None:
            assert result.passed, (cell_id, result.verdict.headline)
            continue
        assert result.verdict.categories == [vd.STATE_DIVERGED], cell_id
        assert result.verdict.headline.startswith(
            f"STATE_DIVERGED at step {first} (the restored step of resume from step_{first}): ema_model differs"), \
            (cell_id, result.verdict.headline)
