"""Crash smoke cells by default (crash consistency was opt-in, so the default matrix passed
a non-atomic torch.save). A target that declares nothing gets a few crash cells on the save of step 2:
the built-in loop's planted non-atomic save fails them, its atomic save passes them. Real child
processes, SIGKILL and files on disk."""

from __future__ import annotations

import subprocess

import pytest

from pytest_resume_check.cells import matrix as mx
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.targets import CRASH_SMOKE, resume_target

CASE = {"id": "take2", "take": 2, "n": 8}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("smoke"), seed=5, hang_timeout=30, check_determinism=False)
    yield engine
    engine.close()


def loop_target(fn, **options):
    from pytest_resume_check.builtin import loop
    from pytest_resume_check.builtin.targets import builtin_loop

    return resume_target(fn, name=fn.__name__, steps=loop.total_steps, cases=[CASE], preload=builtin_loop.preload,
                         **options)


def test_a_non_atomic_save_fails_the_smoke_cells_of_a_target_that_declares_nothing(engine):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check.builtin import loop

    target = loop_target(loop.loop_non_atomic_save)  # no crash_save=: the default
    assert target.crash_save == CRASH_SMOKE
    cells = engine.crash_cells(target, mx.QUICK)
    # mkdir step_2, torch.save(step_2/state.pt), then latest written in place: open, write, close.
    assert [c.kill_id for c in cells] == ["save2op4", "save2op4:power", "save2op5:power", "save2op5:torn:latest"]
    results = {c.kill_id: engine.run_cell(c) for c in cells}
    assert {kill: r.verdict.categories for kill, r in results.items()} == {
        kill: [vd.RESUME_ERROR] for kill in results}
    power = results["save2op5:power"]
    assert "not durable: step_2/state.pt" in power.runs[0].describe()
    assert "torn: latest cut from 6 to 3 bytes" in results["save2op5:torn:latest"].runs[0].describe()


def test_an_atomic_save_passes_its_smoke_cells_and_has_no_file_to_tear(engine):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check.builtin import loop

    cells = engine.crash_cells(loop_target(loop.correct_loop), mx.QUICK)
    ops = cells[0].save_ops
    total, last_write = len(ops), max(op.index for op in ops if op.kind == "write")
    assert ops[last_write].path == "latest.tmp" and ops[-1].kind == "fsync"  # then the folder, once latest is named
    assert [c.kill_id for c in cells] == [f"save2op{total - 1}", f"save2op{last_write + 1}:power",
                                          f"save2op{total}:power"]
    results = [engine.run_cell(c) for c in cells]
    assert [(r.cell.kill_id, r.verdict.headline) for r in results if not r.passed] == []
    # Before the folder's fsync latest already names step_2; latest.tmp lost, latest still names step_1; all durable.
    assert [r.runs[1].resumed_step for r in results] == [2, 1, 2]


def test_smoke_cells_are_the_same_in_full_mode_where_the_whole_axis_stays_opt_in(engine):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check.builtin import loop

    smoke = engine.crash_cells(loop_target(loop.loop_non_atomic_save), mx.FULL)
    every = engine.crash_cells(loop_target(loop.loop_non_atomic_save, crash_save=(2, 1)), mx.FULL)
    # In full mode as in quick mode: the four of the non-atomic save; the whole axis has every crash point.
    assert [c.kill_id for c in smoke] == ["save2op4", "save2op4:power", "save2op5:power", "save2op5:torn:latest"]
    assert len(every) > 20
    assert {c.kill_id for c in smoke} <= {c.kill_id for c in every}  # the smoke cells are some of the axis's


def test_crash_save_false_records_no_save_and_adds_no_cell(engine):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from pytest_resume_check.builtin import loop

    before = engine.steps_executed
    assert engine.crash_cells(loop_target(loop.loop_non_atomic_save, crash_save=False), mx.QUICK) == []
    assert engine.steps_executed == before  # no run


def saved_by_another_process(run):
    """A torch-free trainer whose checkpoint files are written by a helper process (as a framework's
    native writer or a remote worker would): the recorder, which wraps this process's file functions,
    sees none of it."""
    start = 0
    latest = run.checkpoint_dir / "latest"
    if run.resume_mode == "auto" and latest.exists():
        start = int(latest.read_text())
    run.resumed(start, run.checkpoint_dir if start else None)
    for step in range(start + 1, 5):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            subprocess.run(["sh", "-c", f"echo {step} > latest"], cwd=run.checkpoint_dir, check=True)
            run.checkpoint_published(step, run.checkpoint_dir)


def test_a_save_the_recorder_cannot_see_gets_no_smoke_cells(engine):
    target = resume_target(saved_by_another_process, steps=4)
    assert mx.crash_axis(target) == mx.CrashAxis(2, 1, smoke=True)
    assert engine.record_ops(target, target.cases[0], 2, 1) == []
    assert engine.crash_cells(target, mx.QUICK) == []


def never_saves(run):
    """A trainer that publishes no checkpoint, whatever the harness asks."""
    run.resumed(0)
    for step in range(1, 4):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)


def test_a_target_whose_save_cannot_be_recorded_is_told_how_to_turn_the_smoke_cells_off(engine):
    with pytest.raises(RuntimeError) as error:
        engine.crash_cells(resume_target(never_saves, steps=3), mx.QUICK)
    assert "recording the save of step 2 of never_saves failed" in str(error.value)
    assert "declare crash_save=False to turn them off" in str(error.value)
