"""Crash consistency: the file operations of a save are recorded, and a kill before each of them,
power loss, torn files and I/O errors are judged - on the built-in loop (correct and with planted
save bugs). Real child processes, SIGKILL and files on disk."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from pytest_resume_check.builtin import loop  # noqa: E402
from pytest_resume_check.builtin.targets import builtin_loop  # noqa: E402
from pytest_resume_check.cells import matrix as mx  # noqa: E402
from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import faults, kill_ids  # noqa: E402
from pytest_resume_check.run import KillSpec  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

CASE = {"id": "take2", "take": 2, "n": 8}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("crash"), seed=3, hang_timeout=30, check_determinism=False)


def target(fn):
    return resume_target(fn, name=fn.__name__, steps=loop.total_steps, cases=[CASE], preload=builtin_loop.preload)


@pytest.fixture(scope="module")
def correct_ops(engine):
    return engine.record_ops(target(loop.correct_loop), CASE, 2, 1)


def cells_of(engine, fn, mode=mx.QUICK):
    t = target(fn)
    ops = engine.record_ops(t, CASE, 2, 1)
    return mx.crash_cells(t, CASE, ops, 2, 1, mode, random.Random(0))


def test_the_save_is_recorded_op_by_op_in_order(correct_ops):
    kinds = [op.kind for op in correct_ops]
    assert kinds[:2] == ["mkdir", "open"] and kinds[-1] == "fsync"
    assert [(op.kind, op.path, op.target) for op in correct_ops if op.kind == "replace"] == [
        ("replace", "step_2/state.pt.tmp", "step_2/state.pt"), ("replace", "latest.tmp", "latest")]
    assert kinds.index("fsync") < kinds.index("replace")  # durable before it gets its name
    assert [op.index for op in correct_ops] == list(range(len(correct_ops)))


def test_files_fsynced_before_their_rename_cannot_be_torn(correct_ops):
    assert mx.tearable_files(correct_ops) == []


def test_quick_crash_points_keep_every_op_but_inner_writes(correct_ops):
    points = mx.crash_points(correct_ops, mx.QUICK)
    assert points[-1] == len(correct_ops)
    assert {op.index for op in correct_ops if op.kind != "write"} <= set(points)
    assert mx.crash_points(correct_ops, mx.FULL) == list(range(len(correct_ops) + 1))


def test_correct_loop_survives_every_crash_point_power_loss_and_io_error(engine):
    cells = cells_of(engine, loop.correct_loop)
    modes = {c.kills[0].fault.mode for c in cells}
    assert modes == {faults.MODE_CRASH, faults.MODE_POWER, faults.MODE_ERROR}
    failures = [(c.id, r.verdict.headline) for c in cells if not (r := engine.run_cell(c)).passed]
    assert failures == []


def test_a_crash_report_names_the_operation_it_was_killed_before(engine, correct_ops):
    replace_at = next(op.index for op in correct_ops if op.kind == "replace")
    plan = faults.FaultPlan(2, faults.MODE_CRASH, replace_at, total=len(correct_ops))
    result = engine.run_cell(Cell(target(loop.correct_loop), CASE, "auto", (KillSpec(2, 0, plan),),
                                  loop.total_steps(CASE), None, (1,)))
    assert result.passed
    assert "killed before replace(.../step_2/state.pt.tmp -> .../step_2/state.pt)" in result.runs[0].describe()
    assert result.runs[1].resumed_step == 1  # the save of step 2 never completed


def test_non_atomic_save_breaks_the_resume_after_a_crash_or_power_loss(engine):
    cells = cells_of(engine, loop.loop_non_atomic_save)
    torn = [c for c in cells if c.kills[0].fault.mode == faults.MODE_TORN]
    assert {c.kills[0].fault.file for c in torn} == {"step_2/state.pt", "latest"}
    verdicts = {c.id: engine.run_cell(c).verdict for c in cells if c.kills[0].fault.mode != faults.MODE_ERROR}
    broken = {cid: v.categories for cid, v in verdicts.items() if not v.passed}
    assert any(":power" in cid for cid in broken) and any(":torn:" in cid for cid in broken)
    assert all(set(cats) & {vd.RESUME_ERROR, vd.STALE_RESUME, vd.LOST, vd.DUPLICATED} for cats in broken.values())


def test_a_save_that_swallows_io_errors_is_a_silent_io_error(engine):
    cells = [c for c in cells_of(engine, loop.loop_swallow_save_errors) if c.kills[0].fault.mode == faults.MODE_ERROR]
    at_open = next(c for c in cells if c.save_ops[c.kills[0].fault.op].kind == "open")  # inside its try
    result = engine.run_cell(at_open)
    assert result.verdict.categories == [vd.SILENT_IO_ERROR]
    assert "No space left on device" in result.verdict.headline


def test_resuming_from_an_older_checkpoint_than_the_newest_complete_is_stale(engine):
    cells = cells_of(engine, loop.loop_oldest_checkpoint)
    end = next(c for c in cells
               if c.kills[0].fault.mode == faults.MODE_CRASH and c.kills[0].fault.op == c.kills[0].fault.total)
    result = engine.run_cell(end)
    assert vd.STALE_RESUME in result.verdict.categories
    assert "the checkpoint of step 2 was the newest checkpoint" in result.verdict.headline


def test_power_loss_report_names_the_files_that_were_not_durable(engine, correct_ops):
    torch_write = next(op.index for op in correct_ops if op.kind == "write")
    plan = faults.FaultPlan(2, faults.MODE_POWER, torch_write + 1, total=len(correct_ops))
    result = engine.run_cell(Cell(target(loop.correct_loop), CASE, "auto", (KillSpec(2, 0, plan),),
                                  loop.total_steps(CASE), None, (1,)))
    assert result.passed
    assert "not durable: step_2/state.pt.tmp" in result.runs[0].describe()


@pytest.mark.parametrize("label", ["op4", "op4:power", "op4:enospc", "op4:eio+", "op4:torn:latest"])
def test_fault_labels_round_trip_through_cell_ids(label):
    (kill,) = kill_ids.parse_kill_id(f"save2{label}")
    assert kill_ids.kill_id((kill,)) == f"save2{label}"
    assert kill_ids.fault_label(kill.fault) == label
    assert kill_ids.parse_kill_id(f"save2{label.replace('op', '@')}") == (kill,)  # the old spelling still reads
