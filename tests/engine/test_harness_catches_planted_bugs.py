"""The harness catches what it claims: each planted bug of the built-in loop fails with the right
category, the correct loop passes every kill point of the sweep, and no process outlives a run.

These run the real thing: child processes forked from the preloaded server, SIGKILL, real
StatefulDataLoader, checkpoints on disk.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from pytest_resume_check.builtin import loop  # noqa: E402
from pytest_resume_check.builtin.targets import builtin_loop  # noqa: E402
from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.run import KillSpec  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

PRELOAD = builtin_loop.preload
TAKE2 = {"id": "take2", "take": 2}
TAKE4 = {"id": "take4", "take": 4}
SHUFFLE_TAKE2 = {"id": "shuffle-take2", "take": 2, "shuffle": True}
SHUFFLE_TAKE4 = {"id": "shuffle-take4", "take": 4, "shuffle": True}
WORKERS = {"id": "take3-w2", "take": 3, "workers": 2, "shuffle": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("engine"), seed=7, hang_timeout=5)


def target(fn, **kw):
    return resume_target(fn, name=fn.__name__, steps=loop.total_steps, boundaries=loop.epoch_boundaries,
                         preload=PRELOAD, **kw)


def judge(engine, fn, case, *kills, resume_mode="auto"):
    t = target(fn)
    return engine.run_cell(Cell(t, case, resume_mode, tuple(kills), loop.total_steps(case)))


#: drop_buffer's restored buffer is empty where the uninterrupted run's holds ids 2 and 3: the cause, named first.
BUFFER_CAUSE = ("STATE_DIVERGED at step 1 (the restored step of resume from step_1): buffer differs (0.0), model, "
                "optimizer, scheduler, rng, loader and step agree")
BUFFER_LOST = "LOST 2 inputs after resume from step_1: ids 2, 3 (epoch 0)"


def test_dropped_buffer_tail_is_reported_as_lost(engine):
    # The loop reports its buffer: the restored state shows the cause, the ledger which inputs it lost.
    result = judge(engine, loop.loop_drop_buffer, TAKE2, KillSpec(1))
    assert result.verdict.categories == [vd.LOST, vd.STATE_DIVERGED]
    assert [f.headline for f in result.verdict.findings] == [BUFFER_CAUSE, BUFFER_LOST]


def test_buffer_saved_and_reread_from_the_loader_is_reported_as_duplicated(engine):
    result = judge(engine, loop.loop_buffer_and_reread, TAKE2, KillSpec(1))
    assert vd.DUPLICATED in result.verdict.categories
    dup = next(f for f in result.verdict.findings if f.category == vd.DUPLICATED)
    assert set(dup.ids) >= {2, 3}


def test_loader_restarted_at_a_step_count_epoch_boundary_duplicates_inputs(engine):
    # verl's heuristic: "global_steps % len(loader) == 0 means the loader is exhausted". With 2 inputs
    # per step from batches of 4, step 3 is the middle of epoch 0, yet the loader starts over.
    result = judge(engine, loop.loop_restart_at_epoch_boundary, TAKE2, KillSpec(3))
    assert set(result.verdict.categories) & {vd.DUPLICATED, vd.LOST}
    assert vd.DUPLICATED in result.verdict.categories
    assert judge(engine, loop.loop_restart_at_epoch_boundary, TAKE2, KillSpec(2)).passed


def test_fresh_shuffle_after_resume_loses_and_duplicates(engine):
    result = judge(engine, loop.loop_fresh_shuffle, SHUFFLE_TAKE4, KillSpec(2))
    assert {vd.LOST, vd.DUPLICATED} <= set(result.verdict.categories)


def test_epoch_counter_reset_on_resume_is_reported_as_epoch(engine):
    result = judge(engine, loop.loop_epoch_reset, TAKE4, KillSpec(4))
    assert result.verdict.categories == [vd.EPOCH, vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 4 (the restored step of resume from step_4): "
                                              "loader differs (epoch)")
    assert "epoch 0 instead of 1" in result.verdict.findings[1].headline


def test_shared_shuffle_generator_changes_the_next_epoch_order(engine):
    result = judge(engine, loop.loop_shared_generator, SHUFFLE_TAKE2, KillSpec(1))
    # The generator's state differs from the restored step on: the cause, first; the inputs show it at the
    # next epoch.
    assert result.verdict.categories == [vd.REORDERED, vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 1 (the restored step of resume from step_1): "
                                              "loader differs (generators.0)")
    assert result.verdict.findings[1].category == vd.REORDERED


def test_resume_that_raises_is_a_resume_error(engine):
    result = judge(engine, loop.loop_raise_on_resume, TAKE4, KillSpec(2))
    assert result.verdict.categories == [vd.RESUME_ERROR]
    assert "planted bug: resume fails" in result.verdict.headline


def test_run_that_exits_by_itself_is_crashed(engine):
    result = judge(engine, loop.loop_crash, TAKE4, KillSpec(1))
    assert result.verdict.categories == [vd.CRASHED]
    assert "exit code 3" in result.verdict.headline


def test_run_that_stops_sending_events_is_hung_and_killed(engine):
    started = time.monotonic()
    result = judge(engine, loop.loop_hang, TAKE4, KillSpec(1))
    assert result.verdict.categories == [vd.HUNG]
    assert time.monotonic() - started < 60  # the 5 s limit ended it, not the 3600 s sleep
    assert_no_process_left(result.reference.pid)


def assert_no_process_left(pid):
    """The child made its own process group; after the run no member of it is left."""
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


SWEEP = {
    "first": (KillSpec(1),),
    "mid": (KillSpec(4),),
    "before-epoch-boundary": (KillSpec(5),),
    "at-epoch-boundary": (KillSpec(6),),
    "after-epoch-boundary": (KillSpec(7),),
    "last": (KillSpec(12),),
    "past-the-end": (KillSpec(13),),
    "before-any-checkpoint": (KillSpec(0, 2),),
    "unsaved-steps": (KillSpec(3, 2),),
    "twice": (KillSpec(2), KillSpec(8, 1)),
}


@pytest.mark.parametrize("kills", SWEEP.values(), ids=SWEEP.keys())
@pytest.mark.parametrize("resume_mode", ["auto", "path"])
def test_correct_loop_passes_every_kill_point_of_the_sweep(engine, kills, resume_mode):
    result = judge(engine, loop.correct_loop, SHUFFLE_TAKE2, *kills, resume_mode=resume_mode)
    assert result.passed, result.verdict.headline
    assert result.verdict.composite.ids == result.verdict.reference.ids


def test_explicit_path_resume_reads_from_another_output_directory(engine):
    result = judge(engine, loop.correct_loop, TAKE2, KillSpec(3), resume_mode="path")
    first, second = result.runs
    assert second.plan.checkpoint_dir != first.plan.checkpoint_dir
    assert second.plan.resume_path.startswith(first.plan.checkpoint_dir)
    assert second.resumed_step == 3 and result.passed


def test_double_kill_resumes_twice_from_what_each_run_left(engine):
    result = judge(engine, loop.correct_loop, TAKE2, KillSpec(2), KillSpec(6, 1))
    assert [r.outcome for r in result.runs][:2] == ["killed", "killed"]
    assert result.runs[2].outcome in ("done", "converged")
    assert result.verdict.resumed_from == [2, 6]
    assert result.passed


def test_unsaved_steps_are_redone_not_counted(engine):
    result = judge(engine, loop.correct_loop, TAKE2, KillSpec(3, 2))
    first = result.runs[0]
    assert first.last_step == 5 and result.runs[1].resumed_step == 3
    assert result.passed


def test_sigkill_takes_the_loader_workers_with_the_run(engine):
    result = judge(engine, loop.correct_loop, WORKERS, KillSpec(3))
    assert result.passed
    assert result.runs[0].outcome == "killed" and result.runs[1].outcome in ("done", "converged")
    for record in result.runs:
        assert_no_process_left(record.pid)


def test_spawn_isolation_gives_the_same_verdict_as_the_fork_server(tmp_path):
    spawned = Engine(tmp_path, seed=7, hang_timeout=60, isolation="spawn", check_determinism=False)
    t = target(loop.loop_drop_buffer)
    result = spawned.run_cell(Cell(t, TAKE2, "auto", (KillSpec(1),), loop.total_steps(TAKE2)))
    assert [f.headline for f in result.verdict.findings] == [BUFFER_CAUSE, BUFFER_LOST]



def test_a_resumed_run_stops_once_its_state_equals_the_reference(engine):
    result = judge(engine, loop.correct_loop, SHUFFLE_TAKE2, KillSpec(3))
    resumed = result.runs[1]
    assert resumed.outcome == "converged" and resumed.steps_run < loop.total_steps(SHUFFLE_TAKE2) - 3
    assert result.passed and result.verdict.composite.ids == result.verdict.reference.ids


BUG_CELLS = [
    (loop.loop_drop_buffer, TAKE2), (loop.loop_buffer_and_reread, TAKE2),
    (loop.loop_restart_at_epoch_boundary, TAKE2), (loop.loop_fresh_shuffle, SHUFFLE_TAKE4),
    (loop.loop_epoch_reset, TAKE4), (loop.loop_shared_generator, SHUFFLE_TAKE2), (loop.correct_loop, WORKERS),
]


@pytest.mark.parametrize(("fn", "case"), BUG_CELLS, ids=[fn.__name__ for fn, _ in BUG_CELLS])
def test_shared_prefixes_and_early_stops_give_the_verdicts_of_full_runs(tmp_path, fn, case):
    from pytest_resume_check.cells import matrix

    t = target(fn, cases=[case])
    cells = [c for c in matrix.cells(t, matrix.QUICK, seed=7) if c.resume_mode == "auto"]
    fast = Engine(tmp_path / "fast", seed=7, hang_timeout=30, check_determinism=False)
    slow = Engine(tmp_path / "slow", seed=7, hang_timeout=30, check_determinism=False, share=False)
    fast.register(cells)
    verdicts = {}
    for engine in (fast, slow):
        verdicts[engine] = [(c.id, engine.run_cell(c).verdict.categories) for c in cells]
    assert verdicts[fast] == verdicts[slow]
    assert fast.steps_executed < slow.steps_executed
