"""Declaring a zero-change command target: what is refused at declaration, with the fix, and
what a declaration implies (no process starts here)."""

from __future__ import annotations

import pytest

from pytest_resume_check.cells.matrix import at_checkpoints
from pytest_resume_check.child.watch import INDEX, matches
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import CHECKPOINTS_ONLY, EXACTLY_ONCE, TargetError, resume_target

ARGV = ["{python}", "train.py", "--out", "{checkpoint_dir}"]


@pytest.mark.parametrize(("option", "value", "problem"), [
    ("checkpoints", "", "is not a non-empty string"),
    ("checkpoints", 3, "is not a non-empty string"),
    ("checkpoints", "/abs/step_*.pt", "leaves the checkpoint folder"),
    ("checkpoints", "../step_*.pt", "leaves the checkpoint folder"),
    ("checkpoints", "{case_id}/step_*.pt", "holds a placeholder"),
    ("outputs", ["model.pt", "/tmp/out.pt"], "leaves the checkpoint folder"),
])
def test_a_glob_outside_the_checkpoint_folder_is_refused_naming_the_option(option, value, problem):
    with pytest.raises(TargetError) as err:
        resume_target.command(ARGV, name="t", steps=3, **{"checkpoints": "step_*.pt", option: value})
    text = str(err.value)
    assert text.startswith(f"command target 't': {option}=") and problem in text
    assert "relative to the run's checkpoint folder" in text


def test_ranks_are_refused_for_a_program_that_reports_nothing():
    with pytest.raises(TargetError, match="checkpoints= .* runs one process"):
        resume_target.command(ARGV, name="t", steps=3, checkpoints="step_*.pt", world_size=2)


def test_a_declaration_implies_its_contract_and_resume_modes():
    target = resume_target.command(ARGV, name="t", steps=3, checkpoints="step_*.pt", outputs="model.pt")
    assert target.contract == CHECKPOINTS_ONLY and target.resume_modes == ("auto",)
    assert target.command.outputs == ("model.pt",) and target.command.checkpoints == "step_*.pt"
    by_path = resume_target.command([*ARGV, "--resume", "{resume_path}"], name="t", steps=3,
                                    checkpoints="step_*.pt", contract=EXACTLY_ONCE)
    assert by_path.resume_modes == ("auto", "path") and by_path.contract == EXACTLY_ONCE  # what is given stays
    assert "no inputs reported" in CHECKPOINTS_ONLY.describe()


def test_a_glob_matches_part_by_part():
    assert matches("step_3.pt", "step_*.pt") and matches("ckpt_3", "ckpt_*")
    assert not matches("ckpt_3/model.pt", "ckpt_*")  # a file inside a checkpoint folder is not a checkpoint
    assert matches("run/ckpt_3/model.pt", "run/ckpt_*/model.pt")
    assert not matches("step_3.pt.tmp", "step_*.pt")
    assert matches(INDEX, ".*")  # matched here; the watcher skips its own index by name


def test_kills_move_to_the_checkpoint_they_follow():
    points = [("auto", (KillSpec(2),)), ("auto", (KillSpec(2, 1),)), ("auto", (KillSpec(0, 2),)),
              ("auto", (KillSpec(1), KillSpec(5, 1))), ("path", (KillSpec(2),))]
    assert at_checkpoints(points) == [("auto", (KillSpec(2),)), ("auto", (KillSpec(1), KillSpec(5))),
                                      ("path", (KillSpec(2),))]
