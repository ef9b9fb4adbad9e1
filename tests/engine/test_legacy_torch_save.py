"""A ``torch.save`` to a path counts once in either of torch's formats, with real runs: the legacy format
(``_use_new_zipfile_serialization=False``) writes through Python's ``open``, and its close inside the save made
a zero-change program's one checkpoint two publications (its reference "published" twice the checkpoints it
wrote: a false ``PROTOCOL``) and a recorded save two ops and more (the crash cells differed by format)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.run import KillSpec  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "torch_save_program.py"
STEPS = 4
FORMATS = {"zip": (), "legacy": ("--legacy",)}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("legacy_save"), seed=3, hang_timeout=60)


def program(fmt: str):
    return resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}", *FORMATS[fmt]], name=f"save_{fmt}",
                                 steps=STEPS, checkpoints="ckpt_*.pt", outputs=["model.json"], preload=("torch",))


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_checkpoint_saved_by_torch_save_is_one_publication_in_either_format(engine, fmt):
    result = engine.run_cell(Cell(program(fmt), {}, "auto", (KillSpec(2),), STEPS))
    assert result.passed, result.verdict.headline
    assert [e.step for e in result.runs[-1].events if e.kind == "checkpoint"] == [3, 4]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_recorded_save_by_torch_save_is_one_op_in_either_format(engine, fmt):
    ops = engine.record_ops(program(fmt), {}, 2, 1)
    assert [(op.kind, op.path) for op in ops] == [("torch.save", "ckpt_2.pt")]
