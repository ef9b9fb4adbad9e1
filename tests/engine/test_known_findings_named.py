"""A framework's own bug is named under the headline, for real, and only where its preconditions hold.

A cell of the bundled ``lightning_example`` whose declared expected failure is Lightning 2.6's epoch-end
resume bug (docs/findings.md) runs in real children and gets the ``known:`` line in its failure text and its
JSON; the same cell of the case with the ``EpochEndResumeFix`` workaround passes, and a user's own bug that
skips the same epoch there gets no line; a planted ``LOST`` of the plain PyTorch loop gets no such line. An HF
``Trainer`` subclass whose loss keys on a counter kept on ``self`` fails after every resume and gets no line,
with loader workers or without, while the masking collator's mid-epoch cells still get theirs, and the crash
cell that empties ``trainer_state.json`` gets the non-durable save's. docs/reading-a-report.md and
docs/findings.md quote what these runs print.
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
FINDINGS = Path(__file__).resolve().parents[2] / "docs" / "findings.md"
#: 40 inputs in batches of 8: five steps an epoch; step 5 ends epoch 0.
E2 = {"id": "e2-keep2", "keep_last": 2}
E2_FIX = {"id": "e2-fix", "fix_epoch_end": True}
KNOWN = re.compile(r"^  known: Lightning 2\.6: a checkpoint at an epoch's last batch skips the next epoch "
                   r"\(docs/findings\.md#lightning-a-checkpoint-at-an-epochs-last-batch-skips-the-next-epoch\); "
                   r"check: the resumed fit trained no batch of epoch 1 over a stateful train loader, without "
                   r"EpochEndResumeFix in its callbacks; workaround: EpochEndResumeFix$")


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


def fit_remaining_epochs(run):
    """Planted, a user's own bug in a Lightning trainer that carries ``EpochEndResumeFix``: a resumed fit gets
    the epochs the job has left as ``max_epochs`` (counted from the checkpoint's step), but Lightning restores
    its epoch counter and counts from the first epoch: resumed at the end of epoch 0 of 2, it trains nothing."""
    import lightning.pytorch as L
    import torch

    from pytest_resume_check.builtin import lightning_example as ex
    from pytest_resume_check.integrations.lightning import EpochEndResumeFix, LightningResumeCheck

    p = ex.params(run.case)
    L.seed_everything(run.seed, verbose=False)
    resume = ex.checkpoint_to_resume(run)
    done = torch.load(resume, weights_only=False)["global_step"] // ex.steps_per_epoch(run.case) if resume else 0
    check = LightningResumeCheck(run, ids=lambda batch: batch[ex.ID_KEY])
    trainer = ex.make_trainer({**p, "epochs": p["epochs"] - done}, [check, EpochEndResumeFix()])
    trainer.fit(ex.regressor_class()(), train_dataloaders=ex.make_loader(p), ckpt_path=resume)


def test_a_users_skipped_epoch_where_the_workaround_is_in_place_is_not_lightnings(engine):
    ex = pytest.importorskip("pytest_resume_check.builtin.lightning_example")
    pytest.importorskip("lightning")
    target = ex.lightning_example.with_options(fn=fit_remaining_epochs, name="remaining_epochs")
    result = engine.run_cell(Cell(target, E2_FIX, "auto", (KillSpec(5),), ex.total_steps(E2_FIX)))
    # The Lightning bug's shape (the whole next epoch lost after an epoch-end resume), not its cause.
    assert result.verdict.headline.startswith("LOST 40 inputs after resume from step_5.ckpt: "), result.verdict.headline
    assert report.cell_json(result)["known_finding"] is None
    assert "known:" not in report.failure_text(result)


# -- the Hugging Face Trainer ------------------------------------------------------------------------------

def hf_example():
    pytest.importorskip("transformers")
    return pytest.importorskip("pytest_resume_check.builtin.hf_trainer_example")


@pytest.mark.parametrize(("case_index", "kill"), [(0, 2), (0, 3), (1, 1)],
                         ids=["mid-epoch", "epoch-end", "mid-epoch-two-workers"])
def test_a_users_unsaved_counter_in_a_trainer_subclass_gets_no_known_line(engine, case_index, kill):
    """The Trainer subclass anneals its loss with a count kept on ``self``: after every resume the model differs
    on the same batches, under "batch ... and rng agree", a bug of the user's, not the Trainer's."""
    ex = hf_example()
    case = ex.CASES[case_index]
    target = ex.hf_trainer_example.with_options(fn=ex.hf_trainer_unsaved_anneal, name="unsaved_anneal")
    result = engine.run_cell(Cell(target, case, "auto", (KillSpec(kill),), ex.total_steps(case)))
    assert result.verdict.categories == [vd.STATE_DIVERGED], result.verdict.headline
    assert report.cell_json(result)["known_finding"] is None
    assert "known:" not in report.failure_text(result)
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {kill + 1} (first step after resume from checkpoint-{kill}): model differs "), \
        result.verdict.headline
    assert result.verdict.headline.endswith("batch, lr_scheduler, trainer_state and rng agree")


def test_the_masking_collators_mid_epoch_cell_still_gets_its_line(engine):
    ex = hf_example()
    case = ex.CASES[2]  # mlm: 2 steps an epoch; step 1 is inside epoch 0
    cell = Cell(ex.hf_trainer_example, case, "auto", (KillSpec(1),), ex.total_steps(case),
                xfail_reason=ex.MLM_MID_EPOCH)
    assert ex.resumes_mid_epoch(cell)  # the cell the target declares as this finding
    result = engine.run_cell(cell)
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 2 (first step after resume from checkpoint-1): "
                                              "batch differs (0.input_ids), model differs "), result.verdict.headline
    known = report.cell_json(result)["known_finding"]
    assert known["id"] == "hf-trainer-rng-after-collate"
    assert report.failure_text(result).splitlines()[1].endswith(
        "; check: the batch of step 2 holds the uninterrupted run's ids with other values, and the collator or "
        "dataset draws random numbers in the main process (dataloader_num_workers=0)")


def test_the_crash_cell_that_empties_trainer_state_gets_the_non_durable_save_line(engine):
    ex = hf_example()
    target = ex.hf_trainer_example
    named = []
    for cell in engine.crash_cells(target, "auto"):
        result = engine.run_cell(cell)
        known = report.cell_json(result)["known_finding"]
        assert (known is not None) == ex.trainer_state_not_durable(cell), (cell.name, result.verdict.headline)
        if known is not None:
            named.append(result)
            assert known["id"] == "hf-trainer-state-not-durable"
            assert known["check"] == (f"checkpoint-{cell.kills[0].checkpoint_step}/trainer_state.json in the "
                                      "cell's folder is empty or cut, and the job's resume took that folder")
    assert named, "no smoke cell empties trainer_state.json: the save's file operations changed"
    # docs/findings.md quotes this cell's headline.
    assert f"```text\n{named[0].verdict.headline}\n```" in FINDINGS.read_text(encoding="utf-8")
