"""A framework's own bug is named under the headline, for real (issue 29, item 5).

A cell of the bundled ``lightning_example`` whose declared expected failure is Lightning 2.6's epoch-end
resume bug (docs/findings.md) runs in real children and gets the ``known:`` line in its failure text and its
JSON; the same cell of the case with the ``EpochEndResumeFix`` workaround passes; a planted ``LOST`` of the
plain PyTorch loop gets no such line. docs/reading-a-report.md quotes the line this run prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_resume_check.builtin import loop
from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.report import text as report
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

pytest.importorskip("torch")
pytest.importorskip("torchdata")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reading-a-report.md"
#: 40 inputs in batches of 8: five steps an epoch; step 5 ends epoch 0.
E2 = {"id": "e2-keep2", "keep_last": 2}
E2_FIX = {"id": "e2-fix", "fix_epoch_end": True}
KNOWN = re.compile(r"^  known: Lightning 2\.6: a checkpoint at an epoch's last batch skips the next epoch "
                   r"\(docs/findings\.md#lightning-a-checkpoint-at-an-epochs-last-batch-skips-the-next-epoch\); "
                   r"workaround: EpochEndResumeFix$")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("known"), seed=1234, hang_timeout=60)


def quoted_block(marker: str) -> list[str]:
    """The lines of the page's ``console`` block that holds ``marker``."""
    for block in re.findall(r"```console\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S):
        if marker in block:
            return block.rstrip("\n").splitlines()
    raise AssertionError(f"docs/reading-a-report.md has no console block with {marker!r}")


def test_the_lightning_epoch_end_bug_is_named_with_its_workaround(engine):
    ex = pytest.importorskip("pytest_resume_check.builtin.lightning_example")
    pytest.importorskip("lightning")
    target = ex.lightning_example
    cell = Cell(target, E2, "auto", (KillSpec(5),), ex.total_steps(E2), xfail_reason=ex.LIGHTNING_EPOCH_SKIP)
    assert ex.after_last_batch_of_an_epoch(cell)  # the cell the target declares as this bug
    result = engine.run_cell(cell)
    assert result.verdict.categories == [vd.LOST], result.verdict.headline
    text = report.failure_text(result).splitlines()
    assert text[0] == result.verdict.headline and KNOWN.match(text[1]), text[:2]
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "lightning-epoch-end-resume" and known["version"].startswith("2.6.")
    # The page quotes this cell's report up to its target line.
    shown = quoted_block("known: Lightning")
    assert shown == text[:len(shown)]

    fixed = Cell(target, E2_FIX, "auto", (KillSpec(5),), ex.total_steps(E2_FIX))
    assert engine.run_cell(fixed).passed


def test_a_planted_loss_of_the_plain_loop_is_not_a_framework_finding(engine):
    case = {"id": "b4-take2", "n": 8, "batch": 4, "take": 2}
    target = resume_target(loop.loop_drop_buffer, name="drop_buffer", steps=loop.total_steps,
                           boundaries=loop.epoch_boundaries, cases=[case], preload=loop.PRELOAD)
    for kill in (1, 5):  # a buffered tail lost in epoch 0, and one lost in epoch 1
        result = engine.run_cell(Cell(target, case, "auto", (KillSpec(kill),), loop.total_steps(case)))
        assert result.verdict.categories[0] == vd.LOST, result.verdict.headline
        assert report.cell_json(result)["known_finding"] is None
        assert "known:" not in report.failure_text(result)
