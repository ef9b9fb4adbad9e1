"""Matrix generation: kill-point sampling, ids, expected failures (no processes, no torch)."""

from __future__ import annotations

import random

import pytest

from pytest_resume_check.cells import matrix
from pytest_resume_check.records import kill_ids
from pytest_resume_check.run import KillSpec


def some_target(run):  # module level: targets must be importable by name
    pass


def make(**kw):
    from pytest_resume_check.targets import resume_target

    kw.setdefault("steps", 6)
    return resume_target(some_target, **kw)


def test_full_mode_kills_after_every_step_including_the_last():
    steps = matrix.kill_steps(30, [10, 20], matrix.FULL, random.Random(0))
    assert steps == list(range(1, 31))


def test_quick_mode_keeps_first_last_and_both_sides_of_each_epoch_boundary():
    steps = matrix.kill_steps(30, [10, 20], matrix.QUICK, random.Random(0))
    for must in (1, 9, 10, 11, 19, 20, 21, 30):
        assert must in steps
    assert len(steps) == 8 + matrix.QUICK_RANDOM_SAMPLE


def test_quick_mode_sample_depends_on_the_seed_only():
    a = matrix.kill_steps(40, [], matrix.QUICK, random.Random(1))
    b = matrix.kill_steps(40, [], matrix.QUICK, random.Random(1))
    assert a == b


def test_short_runs_get_every_step_even_in_quick_mode():
    assert matrix.kill_steps(5, [], matrix.QUICK, random.Random(0)) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kills", [(KillSpec(3),), (KillSpec(3, 1),), (KillSpec(0, 2),),
                                   (KillSpec(1), KillSpec(5, 1))])
def test_kill_ids_round_trip(kills):
    assert kill_ids.parse_kill_id(kill_ids.kill_id(kills)) == kills


def test_bad_kill_id_names_the_expected_form():
    with pytest.raises(ValueError, match="ckpt3"):
        kill_ids.parse_kill_id("step3")


def test_an_unknown_fault_kind_is_a_value_error_naming_the_expected_form():
    with pytest.raises(ValueError, match="unknown kind 'enoent'.*op<N>:power"):
        kill_ids.parse_kill_id("save3op4:enoent")


@pytest.mark.parametrize(("kills", "column", "kind"), [
    ((KillSpec(3),), "3", ""),
    ((KillSpec(3, 1),), "3+1", ""),
    ((KillSpec(1), KillSpec(7, 1)), "1,7+1", ""),
    ((KillSpec(6, 0, rank=1),), "6", "rank1"),
    ((KillSpec(5, 1, signal="term", grace=2.0),), "5+1", "term2"),
    ((KillSpec(3, 0, resume_world_size=1), KillSpec(5, 0, resume_world_size=1)), "3,5", "ws1"),
])
def test_a_grid_column_is_the_kill_point_and_its_row_the_distributed_kind(kills, column, kind):
    assert (kill_ids.short_label(kills), kill_ids.kind_label(kills)) == (column, kind)


def test_a_cell_name_splits_back_into_its_parts():
    name = kill_ids.cell_name("t", "b4-take2", "path", "ckpt1_ckpt7+1")
    assert name == "t[b4-take2-path-ckpt1_ckpt7+1]"
    assert kill_ids.split_cell_name(name) == ("t", "b4-take2", "path", "ckpt1_ckpt7+1")


def test_cells_cover_auto_and_path_resume_unsaved_steps_and_double_kills():
    cells = matrix.cells(make(), matrix.QUICK, seed=0)
    ids = [c.id for c in cells]
    assert "default-auto-ckpt1" in ids and "default-auto-ckpt6" in ids
    assert "default-auto-ckpt0+2" in ids and "default-auto-ckpt3+1" in ids
    assert any(c.resume_mode == "path" for c in cells)
    assert any(len(c.kills) == 2 for c in cells)
    assert len(ids) == len(set(ids))


def test_expected_failures_mark_only_matching_cells():
    t = make(expected_failures=[(lambda cell: cell.kill_id == "ckpt3" and cell.resume_mode == "auto",
                                  "known bug")])
    marked = [c.id for c in matrix.cells(t, matrix.QUICK, 0) if c.xfail_reason]
    assert marked == ["default-auto-ckpt3"]


def test_a_target_without_path_resume_gets_no_path_cells():
    cells = matrix.cells(make(resume_modes=["auto"]), matrix.QUICK, 0)
    assert {c.resume_mode for c in cells} == {"auto"}


def test_unknown_matrix_mode_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="quick"):
        matrix.cells(make(), "everything", 0)


def test_target_declared_in_a_function_is_refused_with_the_fix():
    from pytest_resume_check.targets import TargetError, resume_target

    def local(run):
        pass

    with pytest.raises(TargetError, match="module level"):
        resume_target(local, steps=3)


def test_quick_mode_samples_steps_where_the_trainer_holds_buffered_inputs():
    steps = matrix.kill_steps(30, [], matrix.QUICK, random.Random(0), buffered=[7, 13])
    assert 7 in steps and 13 in steps
    many = matrix.kill_steps(30, [], matrix.QUICK, random.Random(0), buffered=range(2, 29, 2))
    assert len([s for s in many if s % 2 == 0 and 2 <= s <= 28]) >= matrix.QUICK_BUFFERED_SAMPLE
