"""Crash smoke cells: which targets get them by default, which save and which faults,
and how a declaration turns them off or asks for the whole crash axis (no processes, no torch)."""

from __future__ import annotations

import pytest

from pytest_resume_check.cells import matrix
from pytest_resume_check.records import faults, kill_ids
from pytest_resume_check.records.faults import FileOp
from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH
from pytest_resume_check.targets import CRASH_SMOKE, TargetError, resume_target


def some_target(run):  # module level: targets must be importable by name
    pass


def make(**kw):
    kw.setdefault("steps", 6)
    return resume_target(some_target, **kw)


#: A save through durable renames: each file written to a temporary name, fsynced, renamed.
ATOMIC = (FileOp(0, "mkdir", "step_2"), FileOp(1, "open", "step_2/state.pt.tmp"),
          FileOp(2, "write", "step_2/state.pt.tmp"), FileOp(3, "write", "step_2/state.pt.tmp"),
          FileOp(4, "fsync", "step_2/state.pt.tmp"), FileOp(5, "close", "step_2/state.pt.tmp"),
          FileOp(6, "replace", "step_2/state.pt.tmp", "step_2/state.pt"), FileOp(7, "open", "latest.tmp"),
          FileOp(8, "write", "latest.tmp"), FileOp(9, "fsync", "latest.tmp"), FileOp(10, "close", "latest.tmp"),
          FileOp(11, "replace", "latest.tmp", "latest"), FileOp(12, "fsync", "."))
#: The same save written in place: torch.save to the path, then the pointer file, neither fsynced.
IN_PLACE = (FileOp(0, "mkdir", "step_2"), FileOp(1, "torch.save", "step_2/state.pt"), FileOp(2, "open", "latest"),
            FileOp(3, "write", "latest"), FileOp(4, "close", "latest"))


def smoke_ids(ops, step=2):
    return [kill_ids.fault_label(plan) for plan in matrix.smoke_plans(ops, step)]


def test_a_target_that_declares_nothing_gets_smoke_cells_of_the_save_of_step_2_after_step_1():
    target = make()
    assert target.crash_save == CRASH_SMOKE
    assert matrix.crash_axis(target) == matrix.CrashAxis(2, 1, smoke=True)


def test_crash_save_step_prior_still_asks_for_every_crash_point_of_that_save():
    assert matrix.crash_axis(make(crash_save=(3, 1))) == matrix.CrashAxis(3, 1, smoke=False)
    assert matrix.crash_axis(make(crash_save=[4, 2])) == matrix.CrashAxis(4, 2, smoke=False)


@pytest.mark.parametrize("off", [False, None])
def test_crash_save_false_turns_the_smoke_cells_off(off):
    target = make(crash_save=off)
    assert target.crash_save is None and matrix.crash_axis(target) is None


@pytest.mark.parametrize("options", [
    {"world_size": 2},  # faults are injected in one process
    {"resume_modes": (RESUME_PATH,)},  # a crash cell resumes from what the crash left in its own folder
    {"steps": 1},  # no checkpoint before the faulted save
    {"steps": lambda case: 1 if case.get("short") else 6, "cases": [{"short": True}, {}]},  # the first case
])
def test_targets_the_smoke_cells_cannot_apply_to_get_none(options):
    assert matrix.crash_axis(make(**options)) is None


def test_a_multi_rank_target_declares_fine_but_still_refuses_the_whole_crash_axis():
    assert make(world_size=2).crash_save == CRASH_SMOKE
    with pytest.raises(TargetError, match="crash_save= is not supported with world_size > 1"):
        make(world_size=2, crash_save=(2, 1))


def test_two_steps_and_auto_resume_are_enough_for_smoke_cells():
    assert matrix.crash_axis(make(steps=2, resume_modes=(RESUME_AUTO,))) == matrix.CrashAxis(2, 1, smoke=True)


@pytest.mark.parametrize("bad", [(2,), (1, 2), (2, 2), (2, -1), (2.0, 1), ("2", "1"), (True, 0), "full", True, 3])
def test_a_crash_save_that_is_none_of_the_three_forms_is_refused_with_them(bad):
    with pytest.raises(TargetError) as error:
        make(crash_save=bad)
    message = str(error.value)
    assert f"crash_save={bad!r} is not one of 'smoke'" in message
    assert "crash_save=(2, 1)" in message and "False (no crash cells)" in message


def test_an_atomic_save_gets_a_kill_before_its_last_operation_and_power_losses_after_its_last_write_and_op():
    assert matrix.tearable_files(ATOMIC) == []  # nothing to tear: every file was durable before its name
    assert smoke_ids(ATOMIC) == ["op12", "op9:power", "op13:power"]  # op 8 wrote latest.tmp


def test_a_save_written_in_place_also_gets_its_last_written_file_torn():
    assert smoke_ids(IN_PLACE) == ["op4", "op4:power", "op5:power", "op5:torn:latest"]


def test_a_save_whose_writes_the_recorder_does_not_see_gets_the_kill_and_the_power_loss_at_its_end():
    renamed = (FileOp(0, "fsync", ".ckpt.partial"), FileOp(1, "replace", ".ckpt.partial", "step_2.ckpt"),
               FileOp(2, "fsync", "."))  # written by native code, then fsynced and renamed
    assert smoke_ids(renamed) == ["op2", "op3:power"]


def test_a_save_whose_last_operation_is_a_write_gets_one_power_loss():
    assert smoke_ids((FileOp(0, "mkdir", "step_2"), FileOp(1, "torch.save", "step_2/state.pt"))) == [
        "op1", "op2:power", "op2:torn:step_2/state.pt"]


def test_the_smoke_cells_stay_few_however_many_operations_and_files_the_save_has():
    ops = [FileOp(0, "mkdir", "step_2")]
    for n in range(40):  # 40 files, each written in place
        ops += [FileOp(len(ops), "open", f"step_2/shard{n}"), FileOp(len(ops) + 1, "write", f"step_2/shard{n}"),
                FileOp(len(ops) + 2, "close", f"step_2/shard{n}")]
    assert smoke_ids(ops) == ["op120", "op120:power", "op121:power", "op121:torn:step_2/shard39"]


def test_a_save_the_recorder_saw_nothing_of_gets_no_smoke_cells():
    assert matrix.smoke_plans((), 2) == []


def test_smoke_cells_resume_automatically_after_a_prior_checkpoint_and_carry_expected_failures():
    torn = "the pointer file is written in place"
    target = make(expected_failures=[(lambda cell: cell.kills[0].fault.mode == faults.MODE_TORN, torn)])
    cells = matrix.smoke_cells(target, target.cases[0], IN_PLACE, 2, 1)
    assert [c.kill_id for c in cells] == ["save2op4", "save2op4:power", "save2op5:power", "save2op5:torn:latest"]
    assert {(c.resume_mode, c.prior_checkpoints, c.save_ops, c.steps) for c in cells} == {
        (RESUME_AUTO, (1,), IN_PLACE, 6)}
    assert [c.xfail_reason for c in cells] == [None, None, None, torn]
    assert all(c.kills[0].fault.total == len(IN_PLACE) for c in cells)


def test_an_expected_failure_predicate_that_raises_names_the_target():
    def broken(cell):
        raise KeyError("mode")

    target = make(name="smoky", expected_failures=[(broken, "never")])
    with pytest.raises(TargetError, match="target 'smoky': expected_failures.*KeyError"):
        matrix.smoke_cells(target, target.cases[0], IN_PLACE, 2, 1)
