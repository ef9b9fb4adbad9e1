"""The Accelerate integration: AccelerateResumeCheck's own behaviour in one process (steps on optimizer steps,
publication only of complete folders, the resumed step and folder of whatever ``load_state`` loads, with no
folder Accelerate's own pick, the restored state right after ``load_state``, the final models, the checkpoint
numbering), the bundled example's cells run for real (forked, SIGKILLed, resumed), each planted bug and each
finding failing for its reason (an optimizer or scheduler that ignores the state ``load_state`` gives it at
the restored step, an average kept outside the checkpoint in the final outputs, a trainer's own resume that
sorts folder names as a stale resume where it bites), and the recipe project's matrix passing when run as a
user runs it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_session import assert_one_smoke_xfail

pytest.importorskip("torch")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed  # noqa: E402

from pytest_resume_check.builtin import accelerate_example as ex  # noqa: E402
from pytest_resume_check.cells.matrix import QUICK, Cell, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.integrations import accelerate as integration  # noqa: E402
from pytest_resume_check.integrations.accelerate import (  # noqa: E402
    KEY_AT_STEP_END,
    MARKER,
    SETTING_LOADER_GENERATOR,
    AccelerateResumeCheck,
)
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import events as ev  # noqa: E402
from pytest_resume_check.records.state import CAPTURED  # noqa: E402
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, KillSpec, RunContext, RunPlan  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
RECIPE = EXAMPLES / "recipes" / "accelerate"
FINDINGS = EXAMPLES / "findings"
GA2, W2, SKIP = (next(c for c in ex.CASES if c["id"] == name)
                 for name in ("stateful-ga2-keep2", "stateful-shuffle-w2", "skip-shuffle-ga2-folders"))


# -- in one process: a recording run context over a real Accelerator ------------------------------

class Recorder:
    """The events a RunContext sends; on each checkpoint, what its folder held at that moment."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self.published_with: dict[int, set[str]] = {}

    def send(self, event: ev.Event) -> None:
        self.events.append(event)
        if event.kind == ev.CHECKPOINT:
            self.published_with[event.step] = {p.name for p in Path(event.path).iterdir()}

    def of(self, kind: str) -> list[ev.Event]:
        return [e for e in self.events if e.kind == kind]


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; each test builds its own Accelerator from scratch."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def context(tmp_path: Path, mode: str = RESUME_DISABLED, checkpoints=(), resume_path=None,
            report_state=False) -> tuple[RunContext, Recorder]:
    recorder = Recorder()
    plan = RunPlan("t", ("", "", ""), {}, 0, str(tmp_path / "ckpt"), str(tmp_path / "run.log"), resume_mode=mode,
                   resume_path=resume_path and str(resume_path), checkpoint_steps=frozenset(checkpoints),
                   is_resume=mode != RESUME_DISABLED, report_state=report_state)
    (tmp_path / "ckpt").mkdir(parents=True, exist_ok=True)
    return RunContext(plan, recorder), recorder


def accelerator(run: RunContext, ga: int = 1, limit: int | None = None) -> Accelerator:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(cpu=True, gradient_accumulation_steps=ga,
                       dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
                       project_config=ProjectConfiguration(project_dir=str(run.checkpoint_dir),
                                                           automatic_checkpoint_naming=True, total_limit=limit))


def loop(acc: Accelerator, check: AccelerateResumeCheck, batches: int = 5, *, load: bool = False,
         stop_after: int | None = None):
    """A plain Accelerate loop over ``batches`` batches of 2 inputs: model, AdamW, accumulate."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    data = [{"x": torch.full((2,), float(i)), "input_id": i} for i in range(2 * batches)]
    model, optimizer, loader = acc.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=2))
    if load:
        acc.load_state(check.resume_from)
    for i, batch in enumerate(loader):
        with acc.accumulate(model):
            acc.backward(model(batch["x"]).sum())
            optimizer.step()
            optimizer.zero_grad()
        if stop_after is not None and i + 1 == stop_after:
            break
    return loader


def test_steps_count_optimizer_steps_under_gradient_accumulation(tmp_path):
    run, rec = context(tmp_path)
    acc = accelerator(run, ga=2)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=5)  # 2 + 2 + the epoch's last batch alone (Accelerate syncs at the end)
    assert [(e.ids, e.step) for e in rec.of(ev.CONSUMED)] == [((0, 1), 1), ((2, 3), 1), ((4, 5), 2), ((6, 7), 2),
                                                              ((8, 9), 3)]
    assert [e.step for e in rec.of(ev.STEP_END)] == [1, 2, 3]
    assert [e.step for e in rec.of(ev.RESUMED)] == [0]
    assert check.step == 3 and check.epoch == 1


def test_whether_the_prepared_loaders_have_a_generator_is_reported(tmp_path):
    run, rec = context(tmp_path)
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=2)  # its loader has no generator
    assert [e.extra for e in rec.of(ev.SETTINGS)] == [{SETTING_LOADER_GENERATOR: False}]
    run, rec = context(tmp_path / "own")
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc):
        data = [{"x": torch.zeros(2), "input_id": i} for i in range(4)]
        acc.prepare(torch.utils.data.DataLoader(data, batch_size=2, generator=torch.Generator().manual_seed(0)))
    assert [e.extra for e in rec.of(ev.SETTINGS)] == [{SETTING_LOADER_GENERATOR: True}]


def test_a_step_that_never_synchronised_is_not_ended(tmp_path):
    run, rec = context(tmp_path)
    acc = accelerator(run, ga=2)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=5, stop_after=3)  # the third batch starts step 2, whose update never happens
    assert [e.step for e in rec.of(ev.STEP_END)] == [1]
    assert [e.step for e in rec.of(ev.CONSUMED)] == [1, 1, 2]


def test_checkpoint_is_published_only_once_its_folder_is_complete(tmp_path):
    run, rec = context(tmp_path, checkpoints=(1, 3))
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=3)
    assert [e.step for e in rec.of(ev.CHECKPOINT)] == [1, 3]
    for files in rec.published_with.values():  # what the folder held when checkpoint_published was called
        assert {MARKER, "model.safetensors", "optimizer.bin", "dl_state_dict.bin", "random_states_0.pkl"} <= files
    kinds = [e.kind for e in rec.events if e.kind in (ev.STEP_END, ev.CHECKPOINT)]
    assert kinds == [ev.STEP_END, ev.CHECKPOINT, ev.STEP_END, ev.STEP_END, ev.CHECKPOINT]
    marker = json.loads((Path(rec.of(ev.CHECKPOINT)[-1].path) / MARKER).read_text())
    assert (marker["step"], marker["epoch"], marker["batches"]) == (3, 1, 0)  # after the epoch's last batch


def test_resume_reports_the_restored_step_and_continues_checkpoint_numbering(tmp_path):
    run, _ = context(tmp_path, checkpoints=(1, 2))
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=4, stop_after=2)
    saved = sorted(p.name for p in (run.checkpoint_dir / "checkpoints").iterdir())
    assert saved == ["checkpoint_0", "checkpoint_1"]

    resumed, rec = context(tmp_path, mode=RESUME_AUTO, checkpoints=(3,))
    acc = accelerator(resumed)
    with AccelerateResumeCheck(resumed, acc) as check:
        assert check.resume_from == resumed.checkpoint_dir / "checkpoints" / "checkpoint_1"
        loop(acc, check, batches=4, load=True)
    assert [(e.step, Path(e.path).name) for e in rec.of(ev.RESUMED)] == [(2, "checkpoint_1")]
    assert [e.step for e in rec.of(ev.CONSUMED)] == [3, 4]  # the stateful loader skipped the first two batches
    # Accelerate alone would have tried checkpoint_0 again ("already exists"): the next one is checkpoint_2.
    assert [Path(e.path).name for e in rec.of(ev.CHECKPOINT)] == ["checkpoint_2"]


def test_auto_resume_passes_over_a_folder_whose_save_never_finished(tmp_path):
    run, _ = context(tmp_path, checkpoints=(1,))
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=2, stop_after=1)
    torn = run.checkpoint_dir / "checkpoints" / "checkpoint_7"  # what a kill in the middle of save_state leaves
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\0" * 10)

    resumed, rec = context(tmp_path, mode=RESUME_AUTO)
    acc = accelerator(resumed)
    with AccelerateResumeCheck(resumed, acc) as check:
        loop(acc, check, batches=2, load=True)
    assert [Path(e.path).name for e in rec.of(ev.RESUMED)] == ["checkpoint_0"]
    assert acc.project_configuration.iteration == 8  # past the torn folder too


def test_load_state_without_a_folder_loads_and_reports_accelerates_own_pick(tmp_path):
    run, _ = context(tmp_path, checkpoints=(1, 2))
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=4, stop_after=2)
    auto = run.checkpoint_dir / "checkpoints"
    # As after a numbering that started over: the highest number holds the older step. Accelerate picks by
    # number, and AccelerateResumeCheck reports what was loaded, not the newest checkpoint (the matrix judges that).
    (auto / "checkpoint_0").rename(auto / "checkpoint_5")
    assert integration.accelerate_pick(auto) == auto / "checkpoint_5"
    resumed, rec = context(tmp_path, mode=RESUME_AUTO)
    acc = accelerator(resumed)
    with AccelerateResumeCheck(resumed, acc) as check:
        assert check.resume_from == auto / "checkpoint_1"  # the helper would have chosen by step
        acc.prepare(torch.nn.Linear(2, 1))
        acc.load_state()
    assert [(e.step, Path(e.path).name) for e in rec.of(ev.RESUMED)] == [(1, "checkpoint_5")]

    torn = auto / "checkpoint_7"  # what a kill in the middle of save_state leaves: Accelerate picks it all the same
    torn.mkdir()
    again, _ = context(tmp_path, mode=RESUME_AUTO)
    acc = accelerator(again)
    with pytest.raises(FileNotFoundError, match=rf"checkpoint_7 holds no {MARKER}.*the step it holds is unknown"):
        with AccelerateResumeCheck(again, acc):
            acc.prepare(torch.nn.Linear(2, 1))
            acc.load_state()

    empty, _ = context(tmp_path / "empty", mode=RESUME_AUTO)
    acc = accelerator(empty)
    with pytest.raises(FileNotFoundError, match=r"load_state\(\) with no folder .* but there is none"):
        with AccelerateResumeCheck(empty, acc):
            acc.load_state()


def test_explicit_path_mode_loads_exactly_the_given_folder_and_refuses_an_unpublished_one(tmp_path):
    run, _ = context(tmp_path, checkpoints=(1, 2))
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=3, stop_after=2)
    first = run.checkpoint_dir / "checkpoints" / "checkpoint_0"
    other, rec = context(tmp_path / "other", mode=RESUME_PATH, resume_path=first)
    acc = accelerator(other)
    with AccelerateResumeCheck(other, acc) as check:
        assert check.resume_from == first
        loop(acc, check, batches=3, load=True)
    assert [e.step for e in rec.of(ev.RESUMED)] == [1]

    (first / MARKER).unlink()
    again, _ = context(tmp_path / "again", mode=RESUME_PATH, resume_path=first)
    with pytest.raises(FileNotFoundError, match="run.resume_path to be a published checkpoint"):
        print(AccelerateResumeCheck(again, accelerator(again)).resume_from)
    with pytest.raises(FileNotFoundError, match=f"holds no {MARKER}"):
        integration.read_marker(first)


def reported(rec: Recorder) -> list[tuple[int, dict[str, str]]]:
    """The state AccelerateResumeCheck reported, as (step, {component: digest}), without the generators the harness
    captures at step ends."""
    found = [(e.step, e.extra[ev.STATE_DIGESTS]) for e in rec.of(ev.STATE)]
    return [(step, digests) for step, digests in found if not set(digests) <= CAPTURED]


def test_the_restored_state_is_reported_right_after_load_state(tmp_path):
    run, first = context(tmp_path, checkpoints=(2,), report_state=True)
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=4, stop_after=2)
    folder = run.checkpoint_dir / "checkpoints" / "checkpoint_0"
    assert integration.read_marker(folder)[KEY_AT_STEP_END] == 1  # saved as step 2 ended

    resumed, rec = context(tmp_path / "r", mode=RESUME_PATH, resume_path=folder, report_state=True)
    acc = accelerator(resumed)
    with AccelerateResumeCheck(resumed, acc) as check:
        loop(acc, check, batches=4, load=True)
    after = rec.events[rec.events.index(rec.of(ev.RESUMED)[0]) + 1]
    assert (after.kind, after.step) == (ev.STATE, 2)  # before any batch
    step, restored = reported(rec)[0]
    # Not "data": right after load_state Accelerate's stateful loader still answers with its old position.
    assert (step, sorted(restored)) == (2, ["model", "optimizer", "registered", "rng", "scheduler"])
    want = dict(reported(first))[2]
    assert {name: want[name] for name in restored} == restored
    assert reported(first)[0][0] == 1  # a fresh start reports no restored state


def test_a_folder_saved_after_its_step_moved_on_reports_no_restored_state(tmp_path):
    # The harness's checkpoint of step 3 is saved as the step ends; the trainer's own save after the pass
    # (an epoch-end save) holds what its code did since, so the restored step is not compared from it.
    run, _ = context(tmp_path, checkpoints=(3,), report_state=True)
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=3)
        acc.save_state()
    in_step, after_pass = (run.checkpoint_dir / "checkpoints" / f"checkpoint_{n}" for n in (0, 1))
    assert [integration.read_marker(f)[KEY_AT_STEP_END] for f in (in_step, after_pass)] == [1, 0]

    for folder, restored_steps in ((after_pass, []), (in_step, [3])):
        resumed, rec = context(tmp_path / folder.name, mode=RESUME_PATH, resume_path=folder, report_state=True)
        acc = accelerator(resumed)
        with AccelerateResumeCheck(resumed, acc) as check:
            loop(acc, check, batches=3, load=True)
        assert [e.step for e in rec.of(ev.RESUMED)] == [3]
        assert [step for step, _ in reported(rec) if step == 3] == restored_steps


def test_leaving_the_block_reports_the_models_as_the_final_output(tmp_path):
    run, rec = context(tmp_path, report_state=True)
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc) as check:
        loop(acc, check, batches=2)
    finals = rec.of(ev.FINAL)
    assert [sorted(e.extra[ev.STATE_DIGESTS]) for e in finals] == [["model"]]
    assert rec.events[-1] is finals[0]

    run, rec = context(tmp_path / "off", report_state=True)
    acc = accelerator(run)
    with AccelerateResumeCheck(run, acc, report_final=False) as check:
        loop(acc, check, batches=2)
    assert rec.of(ev.FINAL) == [] and reported(rec)

    run, rec = context(tmp_path / "raised", report_state=True)
    acc = accelerator(run)
    with pytest.raises(ZeroDivisionError):
        with AccelerateResumeCheck(run, acc) as check:
            loop(acc, check, batches=2)
            print(1 / 0)
    assert rec.of(ev.FINAL) == []  # training did not end: nothing was delivered


def test_mistakes_get_one_error_naming_the_fix(tmp_path):
    run, _ = context(tmp_path)
    acc = accelerator(run)
    acc.prepare(torch.utils.data.DataLoader([1, 2]))
    with pytest.raises(RuntimeError, match=r"create AccelerateResumeCheck\(run, accelerator\) before calling"):
        AccelerateResumeCheck(run, acc)

    acc = accelerator(run)
    with pytest.raises(TypeError, match="ids must be a batch key"):
        AccelerateResumeCheck(run, acc, ids=3)
    check = AccelerateResumeCheck(run, acc, ids="row")
    with pytest.raises(RuntimeError, match="already watched by another AccelerateResumeCheck"):
        AccelerateResumeCheck(run, acc)
    with pytest.raises(TypeError, match=r"cannot read input ids .* ids='row'.*pass ids="):
        with check:
            loop(acc, check, batches=1)
    assert "save_state" not in vars(acc)  # leaving the block put the accelerator's own methods back

    elsewhere = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path / "elsewhere"),
                                                                          automatic_checkpoint_naming=True))
    with pytest.raises(ValueError, match="project_dir=run.checkpoint_dir"):
        AccelerateResumeCheck(run, elsewhere)


def test_warm_up_leaves_no_accelerator_for_the_runs_to_inherit():
    # In a fresh interpreter, like the fork server: afterwards an Accelerator with other settings builds.
    code = ("from pytest_resume_check.integrations.accelerate import warm_up; warm_up()\n"
            "import threading\n"
            "from accelerate.state import AcceleratorState, PartialState, GradientState\n"
            "assert not (AcceleratorState._shared_state or PartialState._shared_state or GradientState._shared_state)\n"
            "assert threading.active_count() == 1\n"
            "from accelerate import Accelerator\n"
            "assert Accelerator(cpu=True, gradient_accumulation_steps=3).gradient_accumulation_steps == 3\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# -- the bundled example, run for real ------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("engine"), seed=7, hang_timeout=30)


def judge(engine, fn, case, *kills, resume_mode="auto"):
    target = ex.declare(fn, fn.__name__)
    return engine.run_cell(Cell(target, case, resume_mode, tuple(kills), ex.total_steps(case)))


@pytest.mark.parametrize(("case", "kills", "mode"), [
    (GA2, (KillSpec(3),), "auto"),  # the epoch's last step: the trainer's in-loop checkpoint, epoch not closed
    (GA2, (KillSpec(3, 1),), "auto"),  # then the epoch-end checkpoint is the newest; one step redone
    (GA2, (KillSpec(2), KillSpec(4, 1)), "auto"),  # killed twice: keep-last-2 and the numbering after a load
    (GA2, (KillSpec(3),), "path"),
    (SKIP, (KillSpec(2),), "auto"),  # skip_first_batches at the epoch boundary (epoch-end checkpoint)
    (SKIP, (KillSpec(1), KillSpec(3, 1)), "path"),
    (W2, (KillSpec(5),), "auto"),  # two loader workers, shuffled, resumed inside epoch 1
    (GA2, (KillSpec(0, 2),), "auto"),  # before any checkpoint: a fresh start
], ids=lambda v: v["id"] if isinstance(v, dict) else None)
def test_correct_example_passes(engine, case, kills, mode):
    result = judge(engine, ex.train, case, *kills, resume_mode=mode)
    assert result.passed, result.verdict.headline
    assert result.verdict.resumed_from == [k.checkpoint_step for k in kills]


# -- planted in this module: a loop whose state load_state does not restore, or whose output it misses ---

PLANTED_STEPS = 6  # 12 inputs in batches of 2, one epoch


class StubbornAdamW(torch.optim.AdamW):
    """Planted: an optimizer whose ``load_state_dict`` keeps the state it has, as a hand-written one may."""

    def load_state_dict(self, state_dict):
        pass


class StubbornLambdaLR(torch.optim.lr_scheduler.LambdaLR):
    """Planted: an LR scheduler whose ``load_state_dict`` keeps the state it has."""

    def load_state_dict(self, state_dict):
        pass


def train_planted(run):
    """A plain Accelerate loop: a stateful loader, AdamW and a LambdaLR, prepared inside ``AccelerateResumeCheck``, a
    resume with ``load_state``. ``run.case["plant"]``: ``optimizer`` or ``scheduler`` ignores the state
    ``load_state`` gives it; ``average`` delivers the average of the weights after each step, which the
    checkpoint does not hold; absent: correct."""
    plant = run.case.get("plant")
    set_seed(run.seed)  # Python's, NumPy's and torch's generators: AccelerateResumeCheck reports all three
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
                      project_config=ProjectConfiguration(project_dir=str(run.checkpoint_dir),
                                                          automatic_checkpoint_naming=True))
    model = torch.nn.Linear(2, 1)
    optimizer = (StubbornAdamW if plant == "optimizer" else torch.optim.AdamW)(model.parameters(), lr=0.1)
    scheduler_class = StubbornLambdaLR if plant == "scheduler" else torch.optim.lr_scheduler.LambdaLR
    scheduler = scheduler_class(optimizer, lambda step: 1 / (1 + step))
    data = [{"x": torch.full((2,), float(i)), "input_id": i} for i in range(2 * PLANTED_STEPS)]
    total, count = [torch.zeros_like(p) for p in model.parameters()], 0
    with AccelerateResumeCheck(run, acc) as check:
        # The loader's own generator: without it, it draws its seed from the RNG load_state restored.
        loader = torch.utils.data.DataLoader(data, batch_size=2, generator=torch.Generator().manual_seed(run.seed))
        model, optimizer, scheduler, loader = acc.prepare(model, optimizer, scheduler, loader)
        if check.resume_from is not None:
            acc.load_state(check.resume_from)
        # One epoch: resumed at its end, nothing is left (the stateful loader would start another epoch).
        for batch in loader if check.step < PLANTED_STEPS else ():
            with acc.accumulate(model):
                acc.backward(model(batch["x"]).sum())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total, count = [t + p.detach() for t, p in zip(total, model.parameters())], count + 1
        if plant == "average" and count:
            with torch.no_grad():
                for p, t in zip(model.parameters(), total):
                    p.copy_(t / count)


PLANTED = resume_target(train_planted, name="accelerate_planted", steps=PLANTED_STEPS, preload=ex.PRELOAD)


def judge_planted(engine, plant, *kills):
    case = {"id": plant or "correct", "plant": plant}
    return engine.run_cell(Cell(PLANTED, case, "auto", tuple(kills), PLANTED_STEPS))


@pytest.mark.parametrize("plant", ["optimizer", "scheduler"])
@pytest.mark.parametrize("kill", [3, PLANTED_STEPS], ids=["mid-epoch", "last-step"])
def test_state_load_state_does_not_restore_fails_at_the_restored_step(engine, plant, kill):
    # Judged before the first resumed batch: a resume at the last step, which trains nothing, too.
    result = judge_planted(engine, plant, KillSpec(kill))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    # The model was restored: it agrees (first in the list of those that agree).
    assert re.match(rf"STATE_DIVERGED at step {kill} \(the restored step of resume from "
                    rf"checkpoint_\d+ \(step {kill}\)\): {plant} differs \([\w.]+\), model, ",
                    result.verdict.headline), result.verdict.headline


@pytest.mark.parametrize("kill", [3, PLANTED_STEPS], ids=["mid-epoch", "last-step"])
def test_the_planted_loop_without_a_plant_passes(engine, kill):
    result = judge_planted(engine, None, KillSpec(kill))
    assert result.passed, result.verdict.headline


def test_an_average_kept_outside_the_checkpoint_fails_in_the_final_outputs(engine):
    # Every step's state agrees (the average never feeds back into training): only the delivered model differs.
    result = judge_planted(engine, "average", KillSpec(3))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert re.fullmatch(r"STATE_DIVERGED in the final outputs \(after resume from checkpoint_\d+ \(step 3\)\): "
                        r"model differs \(0\.\w+\)", result.verdict.headline), result.verdict.headline


def test_loader_not_restored_replays_the_epoch(engine):
    assert judge(engine, ex.train, GA2, KillSpec(2)).passed
    result = judge(engine, ex.train_loader_not_restored, GA2, KillSpec(2))
    assert result.verdict.categories == [vd.DUPLICATED, vd.STATE_DIVERGED]
    # The cause first: the loader's state right after the resume is not the checkpoint's.
    assert result.verdict.headline.startswith("STATE_DIVERGED at step 2 (the restored step of resume from "
                                              "checkpoint_0 (step 2)): data differs (loaders.0.")
    assert result.verdict.findings[1].headline == ("DUPLICATED 8 inputs after resume from checkpoint_0 (step 2): ids "
                                                   "0, 1, 2, 3, 4, 5, 6, 7 (epoch 0)")


def test_skip_first_batches_forgotten_replays_the_epoch(engine):
    assert judge(engine, ex.train, SKIP, KillSpec(1)).passed
    result = judge(engine, ex.train_loader_not_restored, SKIP, KillSpec(1))
    assert result.verdict.categories == [vd.DUPLICATED]
    assert result.verdict.headline.startswith("DUPLICATED 4 inputs after resume from step_1: ids ")


def test_optimizer_not_prepared_diverges_the_model(engine):
    assert judge(engine, ex.train, GA2, KillSpec(4)).passed
    result = judge(engine, ex.train_optimizer_not_prepared, GA2, KillSpec(4))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    expected = (r"STATE_DIVERGED at step 5 \(first step after resume from checkpoint_\d \(step 4\)\): model differs "
                r"\(0\.0\.bias\), optimizer, scheduler, registered, rng and data agree")
    assert re.fullmatch(expected, result.verdict.headline)


def test_finding_accelerate_numbering_is_not_continued_after_load_state(engine):
    # AccelerateResumeCheck(continue_naming=False): Accelerate's own numbering. The resumed run's first save fails.
    result = judge(engine, ex.train_raw_naming, GA2, KillSpec(2), KillSpec(4, 1))
    assert result.verdict.categories == [vd.RESUME_ERROR]
    assert "checkpoint_0 (0) already exists" in result.verdict.headline
    assert judge(engine, ex.train, GA2, KillSpec(2), KillSpec(4, 1)).passed


def test_finding_loader_without_generator_moves_the_restored_rng(engine):
    result = judge(engine, ex.train_loader_without_generator, SKIP, KillSpec(1))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    # Restored right (rng agrees at the restored step), then moved by the loader's draw before the first batch.
    assert result.verdict.headline.startswith(
        "STATE_DIVERGED at step 1 (the restored step of resume from step_1): torch CPU RNG differs (captured by the "
        "harness, as step 2 took its first inputs), ")
    assert "rng and data agree" in result.verdict.headline


@pytest.mark.parametrize("kills", [(KillSpec(1),), (KillSpec(3),)], ids=["inside-epoch-0", "end-of-epoch-0"])
def test_finding_workers_case_fails_where_declared(engine, kills):
    result = judge(engine, ex.train, W2, *kills)
    assert set(result.verdict.categories) & {vd.LOST, vd.DUPLICATED, vd.REORDERED}
    cell = Cell(ex.accelerate_example, W2, "auto", kills, ex.total_steps(W2))
    assert ex.resumes_in_first_epoch_with_workers(cell)  # declared: a strict expected failure


# -- the trainer's own "which checkpoint": judged, not replaced --------------------------------------

#: Twelve steps, six an epoch; explicit step_<N> folders, or Accelerate's checkpoint_<n> (n counts saves from 0).
FOLDERS12 = {"id": "folders-12", "naming": ex.FOLDERS, "n": 12}
AUTO12 = {"id": "auto-12", "n": 12}
#: Where sorting the names bites, and what the headline says: "step_9" is the last name in sorted order once
#: step_10 exists; "checkpoint_9" (step 10) once checkpoint_10 (step 11) exists. Before that, and in path
#: mode (the folder the trainer is given), the trainer resumes right.
NAME_SORT_CELLS = {
    (FOLDERS12["id"], "auto", 9): None,
    (FOLDERS12["id"], "auto", 10): "STALE_RESUME: run 2 resumed from step_9 (step 9) but step_10 was published before "
                                   "the kill: 1 step of training lost",
    (FOLDERS12["id"], "auto", 12): "STALE_RESUME: run 2 resumed from step_9 (step 9) but step_12 was published before "
                                   "the kill: 3 steps of training lost",
    (FOLDERS12["id"], "path", 12): None,
    (AUTO12["id"], "auto", 10): None,
    (AUTO12["id"], "auto", 11): "STALE_RESUME: run 2 resumed from checkpoint_9 (step 10) but checkpoint_10 (step 11) "
                                "was published before the kill: 1 step of training lost",
}


def name_sort_cells(fn):
    """The quick-matrix cells of :data:`NAME_SORT_CELLS` (with the checkpoints their first run writes before the
    kill), of ``fn`` over the two twelve-step cases."""
    target = ex.declare(fn, fn.__name__, cases=(FOLDERS12, AUTO12), expected_failures=())
    return {(c.case_id, c.resume_mode, c.kills[0].checkpoint_step): c for c in cells(target, QUICK, seed=1)
            if (c.case_id, c.resume_mode, c.kills[0].checkpoint_step) in NAME_SORT_CELLS and c.shares_prefix}


def test_a_resume_that_sorts_folder_names_is_stale_where_it_bites(engine):
    found = name_sort_cells(ex.train_name_sorted_resume)
    assert set(found) == set(NAME_SORT_CELLS)
    for key, cell in found.items():
        result = engine.run_cell(cell)
        if NAME_SORT_CELLS[key] is None:
            assert result.passed, (key, result.verdict.headline)
        else:
            assert (result.verdict.categories, result.verdict.headline) == ([vd.STALE_RESUME], NAME_SORT_CELLS[key])


def test_the_same_trainer_choosing_by_number_passes_where_the_name_sort_bites(engine):
    for key, cell in name_sort_cells(ex.train).items():
        if NAME_SORT_CELLS[key] is not None:
            result = engine.run_cell(cell)
            assert result.passed, (key, result.verdict.headline)


def test_the_trainers_own_choice_is_by_number_and_the_planted_one_by_name(tmp_path):
    for name in ("step_2", "step_9", "step_10", "checkpoints/checkpoint_9", "checkpoints/checkpoint_10"):
        (tmp_path / name).mkdir(parents=True)
    assert [ex.newest_checkpoint(str(tmp_path), auto) for auto in (False, True)] == [
        str(tmp_path / "step_10"), str(tmp_path / "checkpoints" / "checkpoint_10")]
    assert [ex.newest_by_name(str(tmp_path), auto) for auto in (False, True)] == [
        str(tmp_path / "step_9"), str(tmp_path / "checkpoints" / "checkpoint_9")]
    assert ex.newest_checkpoint(str(tmp_path / "empty"), True) is None


# -- the recipe, run as a user runs it ------------------------------------------------------------

def test_recipe_matrix_passes(pytester: pytest.Pytester) -> None:
    for name in ("conftest.py", "trainer.py", "pytest.ini"):
        shutil.copy(RECIPE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-q", "-rx", timeout=300)
    # 30 resume cells, the trainer's own --resume_from_checkpoint latest (Accelerate's load_state() pick)
    # right in every one, and the default crash smoke cells: of those, the power loss before the save's last
    # file is durable fails, as the recipe declares (docs/recipes/accelerate.md#crash-smoke-cells).
    assert_one_smoke_xfail(result, 30, r"accelerate_regression\[stateful-ga2-keep2-auto-save2op\d+:power\]")


# -- the findings' scripts show what the recipe page says -------------------------------------------

def finding(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FINDINGS / script)], capture_output=True, text=True, timeout=300)


def test_finding_script_naming_shows_the_failed_save_and_the_stale_resume():
    done = finding("accelerate_checkpoint_naming.py")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "project_configuration.iteration = 0" in done.stdout
    assert "checkpoint_0 (0) already exists" in done.stdout
    assert "saved step 3 as checkpoint_0" in done.stdout
    assert "the last resume restored step 2; the newest checkpoint holds step 3" in done.stdout


def test_finding_script_rng_shows_other_draws_only_without_a_loader_generator():
    done = finding("accelerate_loader_rng.py")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    draws = re.findall(r"uninterrupted: (\S+)  resumed: (\S+)", done.stdout)
    assert len(draws) == 2
    (plain_straight, plain_resumed), (own_straight, own_resumed) = draws
    assert plain_straight != plain_resumed and own_straight == own_resumed


def test_finding_script_workers_shows_other_orders_only_with_workers():
    done = finding("accelerate_stateful_workers.py")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    verdicts = re.findall(r"^num_workers=(\d), resumed (.*): (same order|DIFFERENT ORDER)$", done.stdout, re.M)
    assert verdicts == [("0", "after batch 1 of epoch 0", "same order"), ("0", "at the end of epoch 0", "same order"),
                        ("2", "after batch 1 of epoch 0", "DIFFERENT ORDER"),
                        ("2", "at the end of epoch 0", "DIFFERENT ORDER")]
