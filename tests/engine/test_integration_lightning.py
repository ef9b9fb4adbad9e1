"""The PyTorch Lightning integration works as documented.

The ``LightningResumeCheck`` callback reports a real ``Trainer.fit`` (steps on optimizer steps, checkpoints in
place before they are published, the checkpoint and step Lightning restored whoever chose it, the state it
restored, the module the fit delivers); the bundled example, which chooses its checkpoint itself, passes a
representative set of matrix cells run for real (forked children, SIGKILL, checkpoints on disk); each
planted bug fails for the right reason, a lost optimizer or scheduler state at the restored step, an
average kept outside the checkpoint in the final outputs, and a trainer's own resume that sorts checkpoint
names (or takes Lightning's ``last.ckpt``) as a stale resume where it bites;
Lightning's epoch-end resume bug is caught and the opt-in ``EpochEndResumeFix`` removes it; and the recipe
project passes ``pytest --resume-matrix``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from recipe_session import matrix_counts

pytest.importorskip("torch")
pytest.importorskip("torchdata")
pytest.importorskip("lightning")

import lightning.pytorch as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from pytest_resume_check.builtin import lightning_example as ex  # noqa: E402
from pytest_resume_check.cells.matrix import QUICK, Cell, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.integrations.lightning import (  # noqa: E402
    CHECKPOINT_PATTERN,
    SETTING_EPOCH_END_FIX,
    SETTING_STATEFUL_LOADER,
    STATE_FIT_LOOP,
    STATE_LR_SCHEDULERS,
    STATE_MODEL,
    STATE_OPTIMIZERS,
    EpochEndResumeFix,
    LightningResumeCheck,
)
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import events as ev  # noqa: E402
from pytest_resume_check.records.state import CAPTURED  # noqa: E402
from pytest_resume_check.run import KillSpec, RunContext, RunPlan  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

STATE_COMPONENTS = (STATE_MODEL, STATE_OPTIMIZERS, STATE_LR_SCHEDULERS, STATE_FIT_LOOP)
RECIPE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "recipes" / "lightning"
RECIPE_FILES = ("conftest.py", "trainer.py", "pytest.ini")

E2 = {"id": "e2"}  # 40 inputs in batches of 8: five steps per epoch, two epochs
E2_FIX = {"id": "e2-fix", "fix_epoch_end": True}
SHUFFLE_ACCUM2 = {"id": "shuffle-accum2", "shuffle": True, "accumulate": 2}  # three steps per epoch
WORKERS_FIX = {"id": "w2-fix", "n": 24, "shuffle": True, "workers": 2, "fix_epoch_end": True}
KEEP2 = {"id": "keep2", "keep_last": 2}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("engine"), seed=7, hang_timeout=60)


def target_of(fn, cases=({},)):
    return resume_target(fn, name=fn.__name__, steps=ex.total_steps, boundaries=ex.epoch_boundaries, cases=cases,
                         preload=ex.lightning_example.preload)


def judge(engine, fn, case, *kills, resume_mode="auto"):
    return engine.run_cell(Cell(target_of(fn), case, resume_mode, tuple(kills), ex.total_steps(case)))


# -- the bundled example under the real harness ------------------------------------------------------

REPRESENTATIVE = {
    "first-step": (E2, "auto", (KillSpec(1),)),
    "mid-epoch": (KEEP2, "auto", (KillSpec(3),)),
    "mid-epoch-path": (E2, "path", (KillSpec(3),)),
    "next-epoch": (E2, "auto", (KillSpec(7),)),
    "last-step": (KEEP2, "auto", (KillSpec(10),)),
    "before-any-checkpoint": (E2, "auto", (KillSpec(0, 2),)),
    "unsaved-step": (KEEP2, "auto", (KillSpec(7, 1),)),
    "twice": (KEEP2, "auto", (KillSpec(2), KillSpec(8, 1))),
    "accumulating": (SHUFFLE_ACCUM2, "auto", (KillSpec(2),)),
    "accumulating-next-epoch": (SHUFFLE_ACCUM2, "path", (KillSpec(4),)),
    "epoch-end-fixed": (E2_FIX, "auto", (KillSpec(5),)),
    "epoch-end-fixed-path-twice": (E2_FIX, "path", (KillSpec(5), KillSpec(7, 1))),
    "epoch-end-fixed-workers": (WORKERS_FIX, "auto", (KillSpec(3),)),
}


@pytest.mark.parametrize(("case", "resume_mode", "kills"), REPRESENTATIVE.values(), ids=REPRESENTATIVE.keys())
def test_example_resumes_exactly_at_representative_kill_points(engine, case, resume_mode, kills):
    result = judge(engine, ex.fit_example, case, *kills, resume_mode=resume_mode)
    assert result.passed, result.verdict.headline
    assert result.verdict.composite.ids == result.verdict.reference.ids
    assert result.verdict.resumed_from == [k.checkpoint_step for k in kills]


def test_lightning_skips_the_next_epoch_after_a_checkpoint_at_an_epochs_last_batch(engine):
    # The finding: Lightning 2.6 restores the stateful loader at the end of epoch 0, counts epoch 0 as done
    # and then iterates the restored (finished) epoch: nothing of epoch 1 is trained.
    result = judge(engine, ex.fit_example, E2, KillSpec(5))
    assert result.verdict.categories == [vd.LOST]
    assert result.verdict.headline == ("LOST 40 inputs after resume from step_5.ckpt: ids 0, 1, 2, 3, 4, 5, 6, 7, 8, "
                                       "9, ... (30 more) (epoch 1)")
    assert result.runs[-1].resumed_step == 5


def test_the_epoch_skip_is_declared_on_exactly_the_cells_that_resume_from_an_inner_epoch_end():
    matrix = cells(ex.lightning_example, QUICK, seed=1)
    declared = {cell.id for cell in matrix if cell.xfail_reason}
    assert declared == {
        "e2-keep2-auto-ckpt5", "e2-keep2-auto-ckpt5+1", "e2-keep2-path-ckpt5", "e2-keep2-path-ckpt5+1",
        "e2-shuffle-accum2-auto-ckpt3", "e2-shuffle-accum2-auto-ckpt3+1", "e2-shuffle-accum2-path-ckpt3",
        "e2-shuffle-accum2-path-ckpt3+1",
    }
    assert all("Lightning 2.6" in cell.xfail_reason for cell in matrix if cell.xfail_reason)
    assert len(matrix) < 50


def test_plain_dataloader_restarts_the_epoch_after_a_resume(engine):
    # Lightning cannot save a plain DataLoader's position: it replays the epoch's first batches and, as its
    # batch count says the epoch is nearly over, never reaches the last ones.
    result = judge(engine, ex.fit_plain_loader, E2, KillSpec(3))
    assert result.verdict.categories == [vd.LOST, vd.DUPLICATED]
    assert result.verdict.headline == ("LOST 16 inputs after resume from step_3.ckpt: ids 24, 25, 26, 27, 28, 29, 30, "
                                       "31, 32, 33, ... (6 more) (epoch 0)")
    duplicated = next(f for f in result.verdict.findings if f.category == vd.DUPLICATED)
    assert list(duplicated.ids) == list(range(16))
    assert judge(engine, ex.fit_example, E2, KillSpec(3)).passed  # the same cell, correct trainer


# -- planted in this module: state a checkpoint loses, and an output only the end shows -------------

class ForgetfulScheduler(ex.regressor_class()):
    """Planted: the module drops the LR schedulers' saved state when a checkpoint is loaded, so Lightning
    restores the optimizers but leaves the schedulers as they were built."""

    def on_load_checkpoint(self, checkpoint):
        checkpoint["lr_schedulers"] = []


class UnsavedAverage(ex.regressor_class()):
    """Planted: an average of the weights after each step, kept in plain attributes (not in the state dict,
    so not in the checkpoint) and loaded into the module when training ends. Training never reads it: only
    the delivered module shows that a resumed fit averaged fewer steps."""

    def __init__(self):
        super().__init__()
        self.total, self.count = None, 0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        weights = [p.detach().clone() for p in self.parameters()]
        self.total = weights if self.total is None else [t + w for t, w in zip(self.total, weights)]
        self.count += 1

    def on_train_end(self):
        if self.count:
            with torch.no_grad():
                for p, total in zip(self.parameters(), self.total):
                    p.copy_(total / self.count)


def fit_module(run, module_class):
    """The example's fit with another LightningModule class."""
    p = ex.params(run.case)
    L.seed_everything(run.seed, verbose=False)
    check = LightningResumeCheck(run, ids=lambda batch: batch[ex.ID_KEY])
    trainer = ex.make_trainer(p, [check])
    trainer.fit(module_class(), train_dataloaders=ex.make_loader(p), ckpt_path=ex.checkpoint_to_resume(run))


def fit_forgetful_scheduler(run):
    """Planted: the LR schedulers' state is dropped when the checkpoint is loaded."""
    fit_module(run, ForgetfulScheduler)


def fit_unsaved_average(run):
    """Planted: the delivered module is an average the checkpoint does not hold."""
    fit_module(run, UnsavedAverage)


@pytest.mark.parametrize("kill", [3, 10], ids=["mid-epoch", "last-step"])
def test_optimizer_state_dropped_on_load_fails_at_the_restored_step(engine, kill):
    # Before the first resumed batch: even a resume at the last step, which trains nothing, is judged.
    result = judge(engine, ex.fit_fresh_optimizer, E2, KillSpec(kill))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {kill} (the restored step of resume from step_{kill}.ckpt): optimizers differs "
        "(0.param_groups.0.lr), model")


@pytest.mark.parametrize("kill", [3, 10], ids=["mid-epoch", "last-step"])
def test_scheduler_state_dropped_on_load_fails_at_the_restored_step(engine, kill):
    result = judge(engine, fit_forgetful_scheduler, E2, KillSpec(kill))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {kill} (the restored step of resume from step_{kill}.ckpt): lr_schedulers differs ")
    assert "optimizers" in result.verdict.headline.split(" agree")[0].split("differs")[-1]  # they were restored
    assert judge(engine, fit_module_correct, E2, KillSpec(kill)).passed  # the same cell, the example's module


def fit_module_correct(run):
    """The example's module through :func:`fit_module` (the control of the planted variants)."""
    fit_module(run, ex.regressor_class())


def test_an_average_kept_outside_the_checkpoint_fails_in_the_final_outputs(engine):
    # Every step's state agrees (the average never feeds back into training): only the delivered module differs.
    result = judge(engine, fit_unsaved_average, E2, KillSpec(3))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline == ("STATE_DIVERGED in the final outputs (after resume from step_3.ckpt): model "
                                       "differs (net.0.bias)")


# -- the trainer's own "which checkpoint": judged, not replaced --------------------------------------

#: Six steps an epoch, twelve in all, with the epoch-end workaround: every cell passes with a correct choice.
TWELVE = {"id": "e2-12steps-fix", "n": 48, "fix_epoch_end": True}
#: Where sorting the names bites: the first run published step_1.ckpt up to step_10.ckpt (and further), and
#: "step_9.ckpt" is the last name in sorted order. A double kill's second run publishes only step_11.ckpt
#: beside step_1.ckpt, which sorts right ("step_1." < "step_11"); path mode takes the file it is given.
NAME_SORT_BITES = {
    "e2-12steps-fix-auto-ckpt10": "STALE_RESUME: run 2 resumed from step_9.ckpt (step 9) but step_10.ckpt was "
                                  "published before the kill: 1 step of training lost",
    "e2-12steps-fix-auto-ckpt11": "STALE_RESUME: run 2 resumed from step_9.ckpt (step 9) but step_11.ckpt was "
                                  "published before the kill: 2 steps of training lost",
    "e2-12steps-fix-auto-ckpt12": "STALE_RESUME: run 2 resumed from step_9.ckpt (step 9) but step_12.ckpt was "
                                  "published before the kill: 3 steps of training lost",
}


def test_a_resume_that_sorts_checkpoint_names_is_stale_in_exactly_the_cells_where_it_bites(engine):
    matrix = cells(target_of(ex.fit_name_sorted_resume, [TWELVE]), QUICK, seed=1)
    results = {cell.id: engine.run_cell(cell) for cell in matrix}
    assert len(results) == 20  # auto: 12 steps, 2 unsaved, 1 double; path: steps 1, 6, 12, ckpt6+1, 1 double
    failing = {cell_id: (r.verdict.categories, r.verdict.headline) for cell_id, r in results.items() if not r.passed}
    assert failing == {cell_id: ([vd.STALE_RESUME], headline) for cell_id, headline in NAME_SORT_BITES.items()}
    for cell_id in NAME_SORT_BITES:
        assert results[cell_id].verdict.resumed_from == [9]


def test_the_same_trainer_choosing_by_step_passes_where_the_name_sort_bites(engine):
    for cell in cells(target_of(ex.fit_example, [TWELVE]), QUICK, seed=1):
        if cell.id in NAME_SORT_BITES:
            result = engine.run_cell(cell)
            assert result.passed, result.verdict.headline
            assert result.verdict.resumed_from == [cell.kills[0].checkpoint_step]


def fit_from_lightning_last(run):
    """A trainer with its own ``ModelCheckpoint`` (every 5 steps, ``last.ckpt``) that resumes with Lightning's
    ``ckpt_path="last"`` in auto mode. That looks only at the callback's own files, which the harness never
    published: a resume between two of its saves goes back to an older one (docs/recipes/lightning.md, Limits)."""
    p = ex.params(run.case)
    L.seed_everything(run.seed, verbose=False)
    check = LightningResumeCheck(run, ids=lambda batch: batch[ex.ID_KEY])
    own = ModelCheckpoint(dirpath=run.checkpoint_dir, every_n_train_steps=5, save_top_k=-1, save_last=True)
    trainer = ex.make_trainer(p, [check, EpochEndResumeFix()])  # a resume from step 5 keeps epoch 1
    trainer.callbacks.append(own)  # make_trainer turns Lightning's default checkpointing off
    resume = "last" if run.resume_mode == "auto" else ex.checkpoint_to_resume(run)
    trainer.fit(ex.regressor_class()(), train_dataloaders=ex.make_loader(p), ckpt_path=resume)


@pytest.mark.parametrize(("kill", "headline"), [
    (7, "STALE_RESUME: run 2 resumed from last.ckpt (step 5) but step_7.ckpt was published before the kill: 2 steps "
        "of training lost"),
    (3, "STALE_RESUME: run 2 started fresh (resumed step 0) but step_3.ckpt was published before the kill: 3 steps "
        "of training lost"),
], ids=["an-older-checkpoint-the-harness-never-published", "none-yet"])
def test_a_resume_from_a_checkpoint_the_harness_did_not_publish_is_judged_by_its_step(engine, kill, headline):
    cell = Cell(target_of(fit_from_lightning_last), E2, "auto", (KillSpec(kill),), 10, None, tuple(range(1, kill)))
    result = engine.run_cell(cell)
    assert (result.verdict.categories, result.verdict.headline) == ([vd.STALE_RESUME], headline)
    # The trainer's own save at step 5 was a file Lightning wrote: the harness counts what it published.
    assert [step for step, _ in result.runs[0].published] == list(range(1, kill + 1))


# -- the callback's own behaviour, in process --------------------------------------------------------

class Recorder:
    """The event sink of a run context: keeps every event (``check`` sees each as it is sent)."""

    def __init__(self, check=None):
        self.events: list[ev.Event] = []
        self.check = check

    def send(self, event):
        if self.check is not None:
            self.check(event)
        self.events.append(event)

    def of(self, kind):
        return [e for e in self.events if e.kind == kind]


def fit_in_process(folder, case, *, resume_mode="disabled", resume_path=None, checkpoint_steps=(), sink=None,
                   callbacks=(), report_state=False, latest=ex.latest_checkpoint, **options):
    """One fit of the example's trainer in this process, with a LightningResumeCheck reporting to ``sink``
    (``report_state``: as in a run whose state is compared), resuming from what ``latest`` picks in auto mode."""
    sink = sink or Recorder()
    plan = RunPlan("unit", ("", "", ""), case, 7, str(folder), str(folder / "run.log"), resume_mode=resume_mode,
                   resume_path=resume_path and str(resume_path), checkpoint_steps=frozenset(checkpoint_steps),
                   is_resume=resume_mode != "disabled", report_state=report_state)
    run = RunContext(plan, sink)
    p = ex.params(case)
    torch.manual_seed(7)
    check = LightningResumeCheck(run, ids=options.pop("ids", lambda batch: batch[ex.ID_KEY]), **options)
    trainer = ex.make_trainer(p, [check, *callbacks])
    model = ex.regressor_class()()
    trainer.fit(model, train_dataloaders=ex.make_loader(p), ckpt_path=ex.checkpoint_to_resume(run, latest))
    return sink, check


def test_steps_are_optimizer_steps_under_gradient_accumulation(tmp_path):
    sink, _ = fit_in_process(tmp_path, {"accumulate": 2})
    consumed = sink.of(ev.CONSUMED)
    # Five batches per epoch, two per optimizer step: Lightning steps on an epoch's odd last batch alone.
    assert [e.step for e in consumed] == [1, 1, 2, 2, 3, 4, 4, 5, 5, 6]
    assert [e.epoch for e in consumed] == [0] * 5 + [1] * 5
    assert [e.step for e in sink.of(ev.STEP_END)] == [1, 2, 3, 4, 5, 6]
    assert [len(e.ids) for e in consumed] == [8] * 10


def test_a_checkpoint_is_published_only_once_it_is_complete_in_place(tmp_path):
    checked = []

    def at_publication(event):
        if event.kind == ev.CHECKPOINT:
            path = Path(event.path)
            assert CHECKPOINT_PATTERN.match(path.name) and path.is_file()
            assert torch.load(path, weights_only=False)["global_step"] == event.step
            assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left
            checked.append(event.step)

    fit_in_process(tmp_path, {}, checkpoint_steps={2, 5}, sink=Recorder(at_publication))
    assert checked == [2, 5]


def test_keep_last_keeps_only_the_newest_checkpoints(tmp_path):
    fit_in_process(tmp_path, {}, checkpoint_steps=range(1, 11), keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step_10.ckpt", "step_9.ckpt"]


def test_resumed_reports_the_step_lightning_restored(tmp_path):
    fresh, _ = fit_in_process(tmp_path, {}, resume_mode="auto", checkpoint_steps={3})
    assert [(e.step, e.path) for e in fresh.of(ev.RESUMED)] == [(0, None)]

    resumed, _ = fit_in_process(tmp_path, {}, resume_mode="auto")  # finds step_3.ckpt
    assert [(e.step, e.path) for e in resumed.of(ev.RESUMED)] == [(3, str(tmp_path / "step_3.ckpt"))]
    assert resumed.events.index(resumed.of(ev.RESUMED)[0]) < resumed.events.index(resumed.of(ev.CONSUMED)[0])
    assert resumed.of(ev.CONSUMED)[0].step == 4

    other = tmp_path / "other"
    other.mkdir()
    by_path, _ = fit_in_process(other, {}, resume_mode="path", resume_path=tmp_path / "step_3.ckpt")
    assert [e.step for e in by_path.of(ev.RESUMED)] == [3]


def test_resumed_reports_the_checkpoint_the_trainers_code_chose_not_the_newest(tmp_path):
    fit_in_process(tmp_path, {}, checkpoint_steps={3, 7})
    oldest = lambda folder: min(folder.glob("step_*.ckpt"))  # noqa: E731  (the trainer's own, wrong choice)
    resumed, _ = fit_in_process(tmp_path, {}, resume_mode="auto", latest=oldest)
    assert [(e.step, e.path) for e in resumed.of(ev.RESUMED)] == [(3, str(tmp_path / "step_3.ckpt"))]
    assert resumed.of(ev.CONSUMED)[0].step == 4


def test_the_trainers_own_choice_is_by_step_and_the_planted_one_by_name(tmp_path):
    for name in ("step_2.ckpt", "step_9.ckpt", "step_10.ckpt", ".step_11.ckpt.partial", "last.ckpt"):
        (tmp_path / name).write_bytes(b"")
    assert ex.latest_checkpoint(tmp_path) == tmp_path / "step_10.ckpt"
    assert ex.latest_by_name(tmp_path) == tmp_path / "step_9.ckpt"
    assert ex.latest_checkpoint(tmp_path / "empty") is None


def test_a_fit_resumed_at_its_end_still_reports_the_restored_step(tmp_path):
    fit_in_process(tmp_path, {}, resume_mode="auto", checkpoint_steps={10})
    done, _ = fit_in_process(tmp_path, {}, resume_mode="auto")  # restores step 10: nothing left to train
    assert [e.step for e in done.of(ev.RESUMED)] == [10]
    assert done.of(ev.CONSUMED) == []


def reported(sink):
    """The state events the callback sent (not the generators the harness captures at step ends), as
    (step, {component: digest})."""
    found = [(e.step, e.extra[ev.STATE_DIGESTS]) for e in sink.of(ev.STATE)]
    return [(step, digests) for step, digests in found if not set(digests) <= CAPTURED]


@pytest.mark.parametrize(("kill", "components"), [
    (3, sorted(STATE_COMPONENTS)),
    # After an epoch's last batch Lightning counts the epoch as done before the first resumed batch, and
    # an uninterrupted fit only after that batch's on_train_batch_end: the loop is left out there.
    (5, sorted(set(STATE_COMPONENTS) - {STATE_FIT_LOOP})),
], ids=["mid-epoch", "epoch-end"])
def test_a_resumed_fit_reports_the_restored_state_before_its_first_batch(tmp_path, kill, components):
    reference, _ = fit_in_process(tmp_path, {}, checkpoint_steps={kill}, report_state=True)
    resumed, _ = fit_in_process(tmp_path / "r", {}, resume_mode="path", resume_path=tmp_path / f"step_{kill}.ckpt",
                                report_state=True, callbacks=[EpochEndResumeFix()])
    first = next(e for e in resumed.events if e.kind in (ev.STATE, ev.CONSUMED))
    assert (first.kind, first.step) == (ev.STATE, kill)
    step, restored = reported(resumed)[0]
    assert sorted(restored) == components
    want = dict(reported(reference))[kill]
    assert {name: want[name] for name in restored} == restored  # what an uninterrupted fit had after the step
    assert reported(reference)[0][0] == 1  # a fresh start reports no restored state


def test_the_fit_reports_the_module_it_delivers_as_its_final_output(tmp_path):
    sink, _ = fit_in_process(tmp_path, {}, report_state=True)
    finals = sink.of(ev.FINAL)
    assert [sorted(e.extra[ev.STATE_DIGESTS]) for e in finals] == [["model"]]
    assert sink.events.index(finals[0]) > sink.events.index(sink.of(ev.STEP_END)[-1])

    quiet, _ = fit_in_process(tmp_path / "quiet", {}, report_state=True, report_final=False)
    assert quiet.of(ev.FINAL) == []
    assert quiet.of(ev.STATE)  # the state is reported all the same


def context(tmp_path, resume_mode="auto", resume_path=None):
    plan = RunPlan("unit", ("", "", ""), {}, 7, str(tmp_path), str(tmp_path / "run.log"), resume_mode=resume_mode,
                   resume_path=resume_path)
    return RunContext(plan, Recorder())


def test_the_ckpt_path_helper_chooses_the_newest_complete_checkpoint_by_step(tmp_path):
    for name in ("step_9.ckpt", "step_10.ckpt", ".step_11.ckpt.partial", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert LightningResumeCheck(context(tmp_path), ids=list).ckpt_path() == str(tmp_path / "step_10.ckpt")
    assert LightningResumeCheck(context(tmp_path / "empty"), ids=list).ckpt_path() is None
    assert LightningResumeCheck(context(tmp_path, "disabled"), ids=list).ckpt_path() is None


def test_a_missing_resume_path_is_a_clear_error(tmp_path):
    check = LightningResumeCheck(context(tmp_path, "path", str(tmp_path / "step_3.ckpt")), ids=list)
    with pytest.raises(FileNotFoundError, match=r"step_3\.ckpt, which is not a checkpoint file"):
        check.ckpt_path()


def test_mistakes_in_the_arguments_name_the_fix(tmp_path):
    with pytest.raises(TypeError, match=r"ids must be a function of a batch .* ids=lambda batch"):
        LightningResumeCheck(context(tmp_path), ids="input_id")
    with pytest.raises(ValueError, match=r"keep_last must be a whole number of at least 1"):
        LightningResumeCheck(context(tmp_path), ids=list, keep_last=0)
    with pytest.raises(ValueError, match=r"ids\(batch\) raised KeyError: 'id' on a dict batch with keys "
                                         r"\['input_id', 'x', 'y'\]; .* ids=lambda batch: batch\['input_id'\]"):
        fit_in_process(tmp_path, {}, ids=lambda batch: batch["id"])


class EpochStarts(L.Callback):
    def __init__(self):
        self.epochs = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.epochs.append(trainer.current_epoch)


def test_epoch_end_fix_starts_the_next_epoch_as_an_uninterrupted_fit_does(tmp_path):
    fit_in_process(tmp_path, {}, resume_mode="auto", checkpoint_steps={5})
    first = tmp_path / "step_5.ckpt"
    starts = EpochStarts()
    broken, _ = fit_in_process(tmp_path / "a", {}, resume_mode="path", resume_path=first, callbacks=[starts])
    # The Lightning bug: no input and no epoch start. Once Lightning fixes it this fails: retire the fix.
    assert (broken.of(ev.CONSUMED), starts.epochs) == ([], [])

    starts = EpochStarts()
    fixed, _ = fit_in_process(tmp_path / "b", {}, resume_mode="path", resume_path=first,
                              callbacks=[EpochEndResumeFix(), starts])
    assert [i for e in fixed.of(ev.CONSUMED) for i in e.ids] == list(range(40))
    assert {e.epoch for e in fixed.of(ev.CONSUMED)} == {1}
    assert [e.step for e in fixed.of(ev.STEP_END)] == [6, 7, 8, 9, 10]
    assert starts.epochs == [1]


def test_the_loader_and_the_workaround_are_reported_as_settings(tmp_path):
    sink, _ = fit_in_process(tmp_path / "a", {"epochs": 1})
    assert [e.extra for e in sink.of(ev.SETTINGS)] == [{SETTING_STATEFUL_LOADER: True, SETTING_EPOCH_END_FIX: False}]
    sink = Recorder()  # a plain DataLoader, whose position Lightning cannot save, and the workaround
    p = ex.params({"epochs": 1})
    run = RunContext(RunPlan("unit", ("", "", ""), {}, 7, str(tmp_path), str(tmp_path / "run.log")), sink)
    trainer = ex.make_trainer(p, [LightningResumeCheck(run, ids=lambda batch: batch[ex.ID_KEY]), EpochEndResumeFix()])
    trainer.fit(ex.regressor_class()(), train_dataloaders=ex.make_loader(p, stateful=False))
    assert [e.extra for e in sink.of(ev.SETTINGS)] == [{SETTING_STATEFUL_LOADER: False, SETTING_EPOCH_END_FIX: True}]


# -- the recipe project, run as a user runs it ---------------------------------------------------------

def test_recipe_glue_is_at_most_ten_lines():
    text = (RECIPE / "conftest.py").read_text()
    glue = text.split("# --8<-- [start:glue]")[1].split("# --8<-- [end:glue]")[0]
    code = [line for line in glue.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 10, code


def test_recipe_project_passes_its_resume_matrix(pytester: pytest.Pytester):
    for name in RECIPE_FILES:
        shutil.copy(RECIPE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q",
                                           "--resume-matrix-seed=1", timeout=300)
    # 2 cases x (auto: 10 steps, 2 unsaved, 1 double; path: steps 1, 5, 10, ckpt5+1, 1 double), and the crash
    # cells the harness adds by default, if any; the cells that resume from step 5 are Lightning's epoch skip,
    # declared in the glue. The trainer's own choice of checkpoint is right in every cell.
    cells_run, failing, expected = matrix_counts(result)
    assert cells_run >= 36 and (failing, expected) == (0, 8)
    result.assert_outcomes(passed=cells_run - 8, xfailed=8)
    assert result.ret == 0
