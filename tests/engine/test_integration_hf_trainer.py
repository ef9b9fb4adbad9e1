"""The Hugging Face Trainer integration (``pytest_resume_check.integrations.hf_trainer``) reports what the
Trainer really does: the bundled example, which chooses its checkpoint itself, passes its cells, its
planted bugs fail for the right reason (a lost optimizer or scheduler state at the restored step, an average
kept outside the checkpoint in the final outputs, a resume that sorts folder names as a stale resume where
it bites), the Trainer's mid-epoch RNG finding fails as declared, and the callback's own behaviour
(optimizer steps under gradient accumulation, publishing only complete checkpoints, the restored step,
folder and state whoever chose the checkpoint, the final model, clear errors) holds.

Cells run the real thing: children forked from the preloaded server, SIGKILL, real Trainer checkpoints.
The unit tests run the example's Trainer in this process with a run context that records its events.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_session import assert_one_smoke_xfail

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed  # noqa: E402

from pytest_resume_check.builtin import hf_trainer_example as ex  # noqa: E402
from pytest_resume_check.cells.matrix import QUICK, Cell, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.integrations import hf_trainer  # noqa: E402
from pytest_resume_check.integrations.hf_trainer import HFTrainerResumeCheck  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import events as ev  # noqa: E402
from pytest_resume_check.records.state import CAPTURED  # noqa: E402
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, KillSpec, RunContext, RunPlan  # noqa: E402

SHUFFLE, ACCUM, MLM = ex.CASES  # 6 steps (3 an epoch), 4 steps (2 an epoch, accumulation 2, 2 workers), 4 steps
DOCS = Path(__file__).resolve().parents[2] / "docs"
RECIPE = DOCS / "examples" / "recipes" / "hf_trainer"
RECIPE_PAGE = DOCS / "recipes" / "hf-trainer.md"
RECIPE_FILES = ("conftest.py", "trainer.py", "pytest.ini")
GLUE = re.compile(r"# --8<-- \[start:glue\]\n(.*?)# --8<-- \[end:glue\]", re.S)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("engine"), seed=7, hang_timeout=60)


def judge(engine, fn, case, *kills, resume_mode=RESUME_AUTO):
    target = ex.hf_trainer_example.with_options(fn=fn, name=fn.__name__)
    return engine.run_cell(Cell(target, case, resume_mode, tuple(kills), ex.total_steps(case)))


# -- the bundled example, cell by cell ---------------------------------------------------------------

REPRESENTATIVE = {
    "epoch-end-checkpoint": (SHUFFLE, RESUME_AUTO, (KillSpec(3),), [3]),
    "mid-epoch-path": (SHUFFLE, RESUME_PATH, (KillSpec(4),), [4]),
    "unsaved-step-after-a-rotated-checkpoint": (SHUFFLE, RESUME_AUTO, (KillSpec(4, 1),), [4]),
    "double-kill-accumulation-workers": (ACCUM, RESUME_AUTO, (KillSpec(1), KillSpec(3, 1)), [1, 3]),
    "masked-lm-at-the-epoch-boundary": (MLM, RESUME_AUTO, (KillSpec(2),), [2]),
}


@pytest.mark.parametrize(("case", "resume_mode", "kills", "resumed_from"), REPRESENTATIVE.values(),
                         ids=REPRESENTATIVE.keys())
def test_correct_example_resumes_exactly(engine, case, resume_mode, kills, resumed_from):
    result = judge(engine, ex.correct, case, *kills, resume_mode=resume_mode)
    assert result.passed, result.verdict.headline
    assert result.verdict.composite.ids == result.verdict.reference.ids
    assert result.verdict.resumed_from == resumed_from


def test_ignoring_the_data_skip_replays_the_epoch_and_never_reaches_its_end(engine):
    # ignore_data_skip=True: resumed after step 2 of epoch 0, the Trainer trains epoch 0 from its first batch.
    result = judge(engine, ex.hf_trainer_ignore_data_skip, SHUFFLE, KillSpec(2))
    # The generator the harness captures as the next step takes its inputs differs too: the replay moved it,
    # so it follows the input findings and is not named as their cause.
    assert set(result.verdict.categories) == {vd.LOST, vd.DUPLICATED, vd.STATE_DIVERGED}
    assert result.verdict.headline.startswith("LOST 8 inputs after resume from checkpoint-2: ids ")
    assert result.verdict.findings[-1].category == vd.STATE_DIVERGED
    duplicated = next(f for f in result.verdict.findings if f.category == vd.DUPLICATED)
    assert duplicated.headline.startswith("DUPLICATED 8 inputs after resume from checkpoint-2: ")
    assert judge(engine, ex.correct, SHUFFLE, KillSpec(2)).passed  # the same cell, correct


@pytest.mark.parametrize("kill", [2, 6], ids=["mid-epoch", "last-step"])
def test_resuming_from_a_weights_only_checkpoint_fails_at_the_restored_step(engine, kill):
    # save_only_model=True: no optimizer.pt, scheduler.pt or rng_state.pth, and the Trainer resumes anyway.
    # Judged in on_train_begin, before the first resumed batch: a resume at the last step too.
    result = judge(engine, ex.hf_trainer_save_only_model, SHUFFLE, KillSpec(kill))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    # Mid-epoch, the RNG the checkpoint does not hold differs too as the next step takes its inputs; after the
    # last step nothing draws from it.
    rng = ("torch CPU RNG differs (captured by the harness, as step 3 took its first inputs), " if kill == 2 else "")
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {kill} (the restored step of resume from checkpoint-{kill}): optimizer differs "
        f"(param_groups.0.lr), lr_scheduler differs (_last_lr.0), {rng}model and trainer_state agree")
    assert result.verdict.composite.ids == result.verdict.reference.ids  # the inputs were right


# -- planted in this module: a scheduler that ignores its checkpoint, an output only the end shows ----

PLAIN = {"id": "plain"}  # 12 examples in batches of 4: 3 steps an epoch, 2 epochs


class ForgetfulLambdaLR(torch.optim.lr_scheduler.LambdaLR):
    """Planted: a hand-written LR scheduler whose ``load_state_dict`` keeps the state it has."""

    def load_state_dict(self, state_dict):
        pass


class UnsavedAverage(TrainerCallback):
    """Planted: averages the weights after each step in memory (not in the checkpoint) and loads the average
    into the model when training ends. Training never reads it: only the delivered model shows that a
    resumed job averaged fewer steps."""

    def __init__(self):
        self.total, self.count = None, 0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        weights = [p.detach().clone() for p in model.parameters()]
        self.total = weights if self.total is None else [t + w for t, w in zip(self.total, weights)]
        self.count += 1

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.count:
            with torch.no_grad():
                for p, total in zip(model.parameters(), self.total):
                    p.copy_(total / self.count)


def train_with(run, *, scheduler=None, callbacks=(), trainer_class=Trainer, extra=None):
    """The example's fine-tuning (no Trainer saves of its own), with an optimizer and a ``scheduler(optimizer)``
    of the test's making, ``callbacks`` called before HFTrainerResumeCheck, and
    ``extra(trainer)`` as its extra state."""
    p = ex.params(run.case)
    holder = {}
    check = HFTrainerResumeCheck(run, extra_state=None if extra is None else lambda: extra(holder["trainer"]))
    set_seed(run.seed)
    model, dataset, collator = ex.model_and_data(p)
    optimizers = (None, None)
    if scheduler is not None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
        optimizers = (optimizer, scheduler(optimizer))
    args = TrainingArguments(output_dir=str(run.checkpoint_dir), use_cpu=True, seed=run.seed,
                             per_device_train_batch_size=p["batch"], num_train_epochs=p["epochs"], learning_rate=5e-3,
                             save_strategy="no", remove_unused_columns=False, logging_strategy="no", report_to=[],
                             disable_tqdm=True)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collator,
                            callbacks=[*callbacks, check], optimizers=optimizers)
    holder["trainer"] = trainer
    trainer.train(resume_from_checkpoint=ex.checkpoint_to_resume(run))


def decay(step):
    return 1 / (1 + step)


def train_own_scheduler(run):
    """The control: the user's own LambdaLR, which the Trainer saves and restores."""
    train_with(run, scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, decay))


def train_forgetful_scheduler(run):
    """Planted: the user's LR scheduler ignores the state the Trainer loads into it."""
    train_with(run, scheduler=lambda optimizer: ForgetfulLambdaLR(optimizer, decay))


def train_unsaved_average(run):
    """Planted: the delivered model is an average the checkpoint does not hold."""
    train_with(run, callbacks=[UnsavedAverage()])


def train_reported_anneal(run):
    """Planted: the annealed z-loss's count lives on the Trainer subclass, reported as extra state but never
    saved, so a resumed run starts it over."""
    train_with(run, trainer_class=ex.annealed_z_loss_trainer(),
               extra=lambda trainer: {"loss_calls": trainer.loss_calls})


def test_extra_state_the_checkpoint_does_not_hold_is_named_at_the_restored_step_first(engine):
    # Reported for the restored step as the first resumed batch reaches the model (the user's code has
    # restored what it restores by then): the count is the cause, before the model it changes.
    result = judge(engine, train_reported_anneal, PLAIN, KillSpec(2))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith(
        "STATE_DIVERGED at step 2 (the restored step of resume from checkpoint-2): loss_calls differs, model, "), \
        result.verdict.headline


@pytest.mark.parametrize("kill", [2, 6], ids=["mid-epoch", "last-step"])
def test_a_scheduler_that_ignores_its_checkpoint_fails_at_the_restored_step(engine, kill):
    result = judge(engine, train_forgetful_scheduler, PLAIN, KillSpec(kill))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {kill} (the restored step of resume from checkpoint-{kill}): lr_scheduler differs "
        "(_last_lr.0), model, optimizer and trainer_state agree"), result.verdict.headline
    assert judge(engine, train_own_scheduler, PLAIN, KillSpec(kill)).passed  # the same cell, a scheduler that loads


def test_an_average_kept_outside_the_checkpoint_fails_in_the_final_outputs(engine):
    # Every step's state agrees (the average never feeds back into training): only the delivered model differs.
    result = judge(engine, train_unsaved_average, PLAIN, KillSpec(2))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert re.fullmatch(r"STATE_DIVERGED in the final outputs \(after resume from checkpoint-2\): model differs "
                        r"\([\w.]+\)", result.verdict.headline), result.verdict.headline


def test_mid_epoch_resume_with_a_masking_collator_diverges_as_declared(engine):
    # The finding (docs/findings.md): the RNG is restored after the first resumed batches were masked.
    cell = Cell(ex.hf_trainer_example, MLM, RESUME_AUTO, (KillSpec(1),), ex.total_steps(MLM))
    assert ex.resumes_mid_epoch(cell)
    result = judge(engine, ex.correct, MLM, KillSpec(1))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 2 (first step after resume from checkpoint-1): "
                                              "batch differs (0.input_ids), model differs")
    assert result.verdict.composite.ids == result.verdict.reference.ids  # same inputs, other masks
    at_boundary = Cell(ex.hf_trainer_example, MLM, RESUME_AUTO, (KillSpec(2),), ex.total_steps(MLM))
    assert not ex.resumes_mid_epoch(at_boundary)


# -- the job's own "which checkpoint": judged, not replaced ------------------------------------------

#: 24 examples in batches of 4: six steps an epoch, twelve in all, so checkpoint folders on both sides of 10.
LONG = {"id": "long", "n": 24}
#: Where sorting the names bites ("checkpoint-9" is the last name in sorted order once checkpoint-10 exists),
#: and where it does not: before step 10, and in path mode (the folder the job is given).
NAME_SORT_CELLS = {
    ("auto", 9): None,
    ("auto", 10): "STALE_RESUME: run 2 resumed from checkpoint-9 (step 9) but checkpoint-10 was published before the "
                  "kill: 1 step of training lost",
    ("auto", 12): "STALE_RESUME: run 2 resumed from checkpoint-9 (step 9) but checkpoint-12 was published before the "
                  "kill: 3 steps of training lost",
    ("path", 12): None,
}


def name_sort_cells(fn):
    """The quick-matrix cells of :data:`NAME_SORT_CELLS` of ``fn`` over :data:`LONG` (with the checkpoints
    their first run writes before the kill)."""
    target = ex.hf_trainer_example.with_options(fn=fn, name=fn.__name__, cases=(LONG,), expected_failures=())
    return {(c.resume_mode, c.kills[0].checkpoint_step): c for c in cells(target, QUICK, seed=1)
            if c.shares_prefix and (c.resume_mode, c.kills[0].checkpoint_step) in NAME_SORT_CELLS}


def test_a_resume_that_sorts_folder_names_is_stale_where_it_bites(engine):
    found = name_sort_cells(ex.hf_trainer_name_sorted_resume)
    assert set(found) == set(NAME_SORT_CELLS)
    for key, cell in found.items():
        result = engine.run_cell(cell)
        if NAME_SORT_CELLS[key] is None:
            assert result.passed, (key, result.verdict.headline)
        else:
            assert (result.verdict.categories, result.verdict.headline) == ([vd.STALE_RESUME], NAME_SORT_CELLS[key])
            assert result.verdict.resumed_from == [9]


def test_the_same_job_choosing_by_step_passes_where_the_name_sort_bites(engine):
    for key, cell in name_sort_cells(ex.correct).items():
        if NAME_SORT_CELLS[key] is not None:
            result = engine.run_cell(cell)
            assert result.passed, (key, result.verdict.headline)


# -- the callback in this process --------------------------------------------------------------------

class Recorder:
    """The child's end of the event channel, kept in a list; a checkpoint is checked on disk the moment
    it is published (the harness may kill the run right then)."""

    def __init__(self):
        self.events = []
        self.complete_when_published = []

    def send(self, event):
        if event.kind == ev.CHECKPOINT:
            folder = Path(event.path)
            self.complete_when_published.append(all((folder / name).is_file() for name in (
                "trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")))
        self.events.append(event)

    def of(self, kind):
        return [e for e in self.events if e.kind == kind]


def context(tmp_path, case, resume_mode=RESUME_DISABLED, checkpoints=(), resume_path=None, folder="out",
            report_state=False):
    out = tmp_path / folder
    out.mkdir(exist_ok=True)
    plan = RunPlan("hf", ("", "", ""), case, 7, str(out), str(tmp_path / f"{folder}.log"), resume_mode=resume_mode,
                   resume_path=resume_path, checkpoint_steps=frozenset(checkpoints),
                   is_resume=resume_mode != RESUME_DISABLED, report_state=report_state)
    recorder = Recorder()
    return RunContext(plan, recorder), recorder


def test_steps_are_optimizer_steps_under_gradient_accumulation(tmp_path):
    run, recorder = context(tmp_path, {**ACCUM, "workers": 0})  # 3 batches of 2 an epoch, 2 per optimizer step
    ex.train(run)
    consumed = recorder.of(ev.CONSUMED)
    assert [(e.step, e.epoch, len(e.ids)) for e in consumed] == [
        (1, 0, 2), (1, 0, 2), (2, 0, 2), (3, 1, 2), (3, 1, 2), (4, 1, 2)]
    assert [e.step for e in recorder.of(ev.STEP_END)] == [1, 2, 3, 4]
    for epoch in (0, 1):
        assert sorted(i for e in consumed if e.epoch == epoch for i in e.ids) == list(range(6))


def test_checkpoints_are_published_complete_and_the_restored_step_is_reported(tmp_path):
    case = {"id": "c", "n": 8, "batch": 2, "epochs": 1}  # 4 steps
    first, recorder = context(tmp_path, case, checkpoints={2}, report_state=True)
    ex.train(first)
    assert [(e.step, Path(e.path).name) for e in recorder.of(ev.CHECKPOINT)] == [(2, "checkpoint-2")]
    assert recorder.complete_when_published == [True]
    assert recorder.of(ev.RESUMED)[0].step == 0
    # Each step's state comes after its step_end and after its checkpoint, with every component (the
    # process-global generators the harness captures itself at each step end are events of their own).
    reported = [e for e in recorder.events if e.kind != ev.STATE or not set(e.extra[ev.STATE_DIGESTS]) <= CAPTURED]
    order = [(e.kind, e.step) for e in reported if e.kind in (ev.STEP_END, ev.CHECKPOINT, ev.STATE)]
    assert order[:5] == [(ev.STEP_END, 1), (ev.STATE, 1), (ev.STEP_END, 2), (ev.CHECKPOINT, 2), (ev.STATE, 2)]
    components = next(e for e in reported if e.kind == ev.STATE).extra[ev.STATE_DIGESTS]
    assert sorted(components) == ["batch", "lr_scheduler", "model", "optimizer", "rng", "trainer_state"]

    torn = tmp_path / "out" / "checkpoint-3"
    torn.mkdir()  # a save cut short: no trainer_state.json; the helper passes over it, get_last_checkpoint does not
    assert hf_trainer.latest_checkpoint(tmp_path / "out") == tmp_path / "out" / "checkpoint-2"
    assert ex.last_checkpoint(str(tmp_path / "out")) == str(torn)
    torn.rmdir()
    second, recorder = context(tmp_path, case, resume_mode=RESUME_AUTO)
    ex.train(second)
    resumed = recorder.of(ev.RESUMED)
    assert [(e.step, Path(e.path).name) for e in resumed] == [(2, "checkpoint-2")]
    assert [e.step for e in recorder.of(ev.STEP_END)] == [3, 4]


def test_the_restored_folder_is_the_one_the_jobs_code_chose_not_the_newest(tmp_path, monkeypatch):
    case = {"id": "c", "n": 8, "batch": 2, "epochs": 1}  # 4 steps
    first, _ = context(tmp_path, case, checkpoints={1, 3})
    ex.train(first)
    second, recorder = context(tmp_path, case, resume_mode=RESUME_AUTO)
    with monkeypatch.context() as patch:  # the job's own choice, a wrong one: the oldest checkpoint
        patch.setattr(ex, "last_checkpoint", lambda out: str(Path(out) / "checkpoint-1"))
        ex.train(second)
    assert [(e.step, Path(e.path).name) for e in recorder.of(ev.RESUMED)] == [(1, "checkpoint-1")]
    assert [e.step for e in recorder.of(ev.STEP_END)] == [2, 3, 4]

    elsewhere = tmp_path / "elsewhere"  # path mode: the folder the job was given, in another output directory
    (tmp_path / "out" / "checkpoint-3").rename(elsewhere)
    third, recorder = context(tmp_path, case, resume_mode=RESUME_PATH, resume_path=str(elsewhere), folder="out3")
    ex.train(third)
    assert [(e.step, e.path) for e in recorder.of(ev.RESUMED)] == [(3, str(elsewhere))]


def test_each_steps_batches_and_the_loader_workers_are_reported(tmp_path):
    run, recorder = context(tmp_path, {**ACCUM, "workers": 0}, report_state=True)  # 3 batches of 2 an epoch
    ex.train(run)
    assert [e.extra for e in recorder.of(ev.SETTINGS)] == [{hf_trainer.SETTING_WORKERS: 0}]
    batches = [sorted(e.extra[ev.STATE_LEAVES][hf_trainer.STATE_BATCH]) for e in recorder.of(ev.STATE)
               if hf_trainer.STATE_BATCH in e.extra[ev.STATE_DIGESTS]]
    # Step by step, each micro-batch as the model got it (with the token count the Trainer adds): the id key
    # taken out, the accumulation's two micro-batches in one step, an epoch's last step on its odd batch alone.
    one = ["input_ids", "labels", "num_items_in_batch"]
    two = sorted(f"{i}.{key}" for i in range(2) for key in one)
    assert batches == [two, [f"0.{key}" for key in one], two, [f"0.{key}" for key in one]]


def test_the_trainers_own_choice_is_by_step_and_the_planted_one_by_name(tmp_path):
    for name in ("checkpoint-2", "checkpoint-9", "checkpoint-10"):
        (tmp_path / name).mkdir()
    assert ex.last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert ex.last_by_name(str(tmp_path)) == str(tmp_path / "checkpoint-9")
    assert ex.last_checkpoint(str(tmp_path / "missing")) is None


def test_the_trainers_own_saves_are_published_and_rotation_keeps_the_latest(tmp_path):
    case = {"id": "c", "n": 8, "batch": 2, "epochs": 1, "save_steps": 1, "keep": 2}
    run, recorder = context(tmp_path, case)
    ex.train(run)
    assert [e.step for e in recorder.of(ev.CHECKPOINT)] == [1, 2, 3, 4]
    assert all(recorder.complete_when_published)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-3", "checkpoint-4"]


def reported(recorder):
    """The state the callback reported, as (step, {component: digest}), without the generators the harness
    captures at step ends."""
    found = [(e.step, e.extra[ev.STATE_DIGESTS]) for e in recorder.of(ev.STATE)]
    return [(step, digests) for step, digests in found if not set(digests) <= CAPTURED]


def test_the_restored_state_and_the_final_model_are_reported(tmp_path):
    case = {"id": "c", "n": 8, "batch": 2, "epochs": 1}  # 4 steps
    first, reference = context(tmp_path, case, checkpoints={2}, report_state=True)
    ex.train(first)
    assert reported(reference)[0][0] == 1  # a fresh start reports no restored state
    second, recorder = context(tmp_path, case, resume_mode=RESUME_AUTO, report_state=True)
    ex.train(second)
    after = recorder.events[recorder.events.index(recorder.of(ev.RESUMED)[0]) + 1]
    assert (after.kind, after.step) == (ev.STATE, 2)  # in on_train_begin, before the first batch
    step, restored = reported(recorder)[0]
    # Not the RNGs: the Trainer restores them later, in the first epoch it runs.
    assert sorted(restored) == ["lr_scheduler", "model", "optimizer", "trainer_state"]
    want = dict(reported(reference))[2]
    assert {name: want[name] for name in restored} == restored
    for events in (reference, recorder):
        finals = events.of(ev.FINAL)
        assert [sorted(e.extra[ev.STATE_DIGESTS]) for e in finals] == [["model"]]
        assert events.events.index(finals[0]) > events.events.index(events.of(ev.STEP_END)[-1])


def tiny_trainer(run, check, **overrides):
    model, dataset, collator = ex.model_and_data(ex.params({"n": 4, "batch": 2}))
    options = {"output_dir": str(run.checkpoint_dir), "use_cpu": True, "report_to": [], "disable_tqdm": True,
               "logging_strategy": "no", "save_strategy": "no", "per_device_train_batch_size": 2,
               "num_train_epochs": 1, "remove_unused_columns": False, **overrides}
    return Trainer(model=model, args=TrainingArguments(**options), train_dataset=dataset, data_collator=collator,
                   callbacks=[check])


def test_report_final_false_reports_no_final_model(tmp_path):
    run, recorder = context(tmp_path, {}, report_state=True)
    tiny_trainer(run, HFTrainerResumeCheck(run, report_final=False)).train()
    assert recorder.of(ev.FINAL) == [] and reported(recorder)


def test_dropped_id_column_names_the_argument_to_change(tmp_path):
    run, _ = context(tmp_path, {})
    with pytest.raises(ValueError, match=r"remove_unused_columns=True\) drops the 'input_id' column.*"
                                         r"pass remove_unused_columns=False"):
        tiny_trainer(run, HFTrainerResumeCheck(run), remove_unused_columns=True).train()


def test_another_output_directory_names_the_argument_to_change(tmp_path):
    run, _ = context(tmp_path, {})
    check = HFTrainerResumeCheck(run)
    with pytest.raises(ValueError, match=re.escape("pass TrainingArguments(output_dir=str(run.checkpoint_dir))")):
        tiny_trainer(run, check, output_dir=str(tmp_path / "elsewhere")).train()


def test_ids_function_with_one_id_per_token_is_refused(tmp_path):
    run, _ = context(tmp_path, {})
    check = HFTrainerResumeCheck(run, ids=lambda batch: batch["input_ids"][0])  # a row of tokens, not one id a row
    with pytest.raises(ValueError, match=r"returned 8 ids for a batch of 2 examples.*one id per example"):
        tiny_trainer(run, check).train()


def test_missing_id_key_and_wrong_arguments_are_named(tmp_path):
    run, _ = context(tmp_path, {})
    with pytest.raises(KeyError, match=r"has no 'idx' key.*WithIds"):
        tiny_trainer(run, HFTrainerResumeCheck(run, ids="idx")).train()
    with pytest.raises(TypeError, match=r"pass the `run` your target function receives"):
        HFTrainerResumeCheck(tmp_path)
    with pytest.raises(TypeError, match=r"give the batch key that holds the ids"):
        HFTrainerResumeCheck(run, ids=3)
    path_run, _ = context(tmp_path, {}, resume_mode=RESUME_PATH, resume_path=str(tmp_path), folder="p")
    check = HFTrainerResumeCheck(path_run)  # choosing is the job's: only the helper looks at the folder
    with pytest.raises(FileNotFoundError, match=r"is not a complete Trainer checkpoint \(no trainer_state.json\)"):
        print(check.resume_from_checkpoint)


# -- the recipe --------------------------------------------------------------------------------------

def test_recipe_project_passes_its_matrix(pytester: pytest.Pytester) -> None:
    for name in RECIPE_FILES:
        shutil.copy(RECIPE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q", "-rx", timeout=600)
    # 14 resume cells, the job's own last_checkpoint right in every one, and the default crash smoke cells:
    # of those, the power loss before trainer_state.json is durable fails, as the recipe declares
    # (docs/recipes/hf-trainer.md#crash-smoke-cells).
    assert_one_smoke_xfail(result, 14, r"hf_trainer_recipe\[workers2-auto-save2op\d+:power\]")


def test_recipe_glue_is_at_most_ten_lines_and_the_page_includes_it():
    glue = GLUE.search((RECIPE / "conftest.py").read_text())
    assert glue is not None
    code = [line for line in glue.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 10, code
    page = RECIPE_PAGE.read_text()
    assert '--8<-- "recipes/hf_trainer/conftest.py"' in page
    assert '--8<-- "recipes/hf_trainer/trainer.py"' in page


def test_finding_script_shows_other_masks_after_a_mid_epoch_resume():
    script = DOCS / "examples" / "findings" / "hf_trainer_rng_after_collate.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("step 2 masks")]
    assert len(lines) == 2, done.stdout + done.stderr[-2000:]
    uninterrupted, resumed = (line.partition(":")[2].strip() for line in lines)
    assert done.returncode == 1 and uninterrupted != resumed  # exits 0 the day transformers fixes it
