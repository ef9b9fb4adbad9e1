"""Commit points of zero-change programs, without processes: what a pointer's content names, which file of an
uninterrupted run is recognised as one, how it is declared, and how reports name it."""

from __future__ import annotations

import pytest

from pytest_resume_check.child import watch
from pytest_resume_check.records.commits import MAX_POINTER_BYTES, named_checkpoint, pointer_text, recognised_commit
from pytest_resume_check.report.summary import MSG_COMMIT_RECOGNISED, session_lines
from pytest_resume_check.targets import TargetError, resume_target

ROOT = "/ckpt"
KNOWN = ["ckpt_2.pt", "ckpt_4.pt", "ckpt_10.pt"]
ARGV = ["{python}", "train.py", "--out", "{checkpoint_dir}"]


@pytest.mark.parametrize(("text", "pointer", "pattern", "known", "named"), [
    ("ckpt_4.pt", "latest.txt", "ckpt_*.pt", KNOWN, "ckpt_4.pt"),  # a name (DeepSpeed's tag)
    ("ckpt_12.pt", "latest.txt", "ckpt_*.pt", KNOWN, "ckpt_12.pt"),  # written before its checkpoint: named all the same
    ("/ckpt/ckpt_4.pt", "latest.txt", "ckpt_*.pt", KNOWN, "ckpt_4.pt"),  # an absolute path inside the folder
    ("/elsewhere/ckpt_4.pt", "latest.txt", "ckpt_*.pt", KNOWN, None),  # ... outside it: no checkpoint of this run
    ("./ckpt_4.pt", "latest.txt", "ckpt_*.pt", KNOWN, "ckpt_4.pt"),
    ("../ckpt_4.pt", "latest.txt", "ckpt_*.pt", KNOWN, None),
    ("global_step10/model.pt", "latest", "global_step*", ["global_step10"], "global_step10"),  # a file in a folder
    ("ckpt_4", "run/latest", "run/ckpt_*", ["run/ckpt_4"], "run/ckpt_4"),  # relative to the pointer's folder
    ("4", "latest.txt", "ckpt_*.pt", KNOWN, "ckpt_4.pt"),  # a step number (verl's tracker)
    ("10", "latest_checkpointed_iteration.txt", "iter_*", ["iter_0000005", "iter_0000010"], "iter_0000010"),  # Megatron
    ("6", "latest.txt", "global_step_*", ["global_step_4"], "global_step_6"),  # not written yet: the glob's one *
    ("6", "latest.txt", "run_*/step_*", [], None),  # two stars: no guess
    ("release", "latest_checkpointed_iteration.txt", "iter_*", ["iter_0000010"], None),
    ("done", "latest.txt", "ckpt_*.pt", KNOWN, None),
])
def test_a_pointer_names_a_checkpoint_by_path_name_or_step_number(text, pointer, pattern, known, named):
    assert named_checkpoint(text, pointer, pattern, known, ROOT) == named


@pytest.mark.parametrize(("raw", "text"), [
    (b"ckpt_4.pt", "ckpt_4.pt"), (b"  4\n", "4"), (b"\n\nglobal_step10\nmore\n", "global_step10"),
    (b"", None), (b"\xff\xfe", None), (b"PK\x03\x04\x00", None), (b"x" * (MAX_POINTER_BYTES + 1), None),
])
def test_a_pointer_holds_one_short_line_of_text(raw, text):
    assert pointer_text(raw) == text


PUBLISHED = ["ckpt_2.pt", "ckpt_4.pt", "ckpt_6.pt"]


@pytest.mark.parametrize(("published", "pointers", "filled", "recognised"), [
    # latest.txt after each checkpoint, or before it: every write names one the run made, and each one is named.
    (PUBLISHED, [("latest.txt", c) for c in PUBLISHED], set(), "latest.txt"),
    # checkpoint folders filled in place (none published) and a tracker naming each
    ([], [("tracker.txt", f"step_{n}") for n in (2, 4)], {"step_2", "step_4"}, "tracker.txt"),
    # a file naming only some checkpoints (the best so far) commits none of the others
    (PUBLISHED, [("best.txt", "ckpt_2.pt"), ("best.txt", "ckpt_6.pt")], set(), None),
    # a progress file counting steps names checkpoints the run never made
    (PUBLISHED, [("step.txt", f"ckpt_{n}.pt") for n in range(1, 7)], set(), None),
    # two files that name the same: the run cannot tell which one the program resumes from
    (PUBLISHED, [(f, c) for c in PUBLISHED for f in ("latest.txt", "latest.bak")], set(), None),
    (PUBLISHED, [], set(), None),
])
def test_the_commit_point_of_an_uninterrupted_run_names_each_checkpoint_it_made(published, pointers, filled,
                                                                                  recognised):
    assert recognised_commit(published, pointers, filled) == recognised


@pytest.mark.parametrize(("options", "problem"), [
    ({"commit": "latest.txt"}, "declare where its checkpoints appear too"),
    ({"checkpoints": "ckpt_*", "commit": "ckpt_latest"}, "matches checkpoints='ckpt_*'"),
    ({"checkpoints": "ckpt_*.pt", "commit": "../latest.txt"}, "leaves the checkpoint folder"),
    ({"checkpoints": "ckpt_*.pt", "commit": ""}, "is not a non-empty string"),
])
def test_a_commit_point_that_cannot_be_one_is_refused_at_declaration(options, problem):
    with pytest.raises(TargetError) as err:
        resume_target.command(ARGV, name="t", steps=3, **options)
    assert str(err.value).startswith("command target 't': commit=") and problem in str(err.value)


def test_a_declared_commit_point_is_kept_with_the_program():
    target = resume_target.command(ARGV, name="t", steps=3, checkpoints="ckpt_*.pt", commit="latest.txt")
    assert target.command.commit == "latest.txt" and target.command.checkpoints == "ckpt_*.pt"
    assert resume_target.command(ARGV, name="t", steps=3, checkpoints="ckpt_*.pt").command.commit is None
    assert watch.matches("ckpt_3.pt", "ckpt_*.pt")  # the glob's rule, where the watcher has always kept it


def _cell(target: str, commit, kill: str = "ckpt1") -> dict:
    return {"target": target, "case_id": "default", "resume_mode": "auto", "kill": kill,
            "kills": [{"checkpoint_step": 1}], "passed": True, "xfail_reason": None, "categories": [],
            "headline": "", "status": "passed", "commit": commit}


def test_the_summary_names_a_recognised_commit_point_once_per_target_and_the_declaration_to_add():
    cells = [_cell("script", {"file": "latest.txt", "recognised": True}),
             _cell("script", {"file": "latest.txt", "recognised": True}, "ckpt2"),
             _cell("declared", {"file": "latest", "recognised": False}), _cell("plain", None)]
    lines = session_lines(cells)
    line = MSG_COMMIT_RECOGNISED.format(target="script", file="latest.txt")
    assert [ln for ln in lines if "recognised as the commit point" in ln] == [line]  # once; not the declared one
    assert line.endswith("declare commit='latest.txt' to say so")
