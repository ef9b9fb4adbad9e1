"""The state verdicts catch what they claim on a real torch trainer (``state_bug_trainer``): a resume
from the wrong checkpoint is STALE_RESUME with the steps of training lost, a piece of state left out
of the checkpoint is STATE_DIVERGED naming that piece, in exactly the cells where the bug can bite,
and the correct trainer passes every cell.

An oracle independent of the digests checks the state verdicts: the final weights (model and EMA) of
the interrupted job equal the uninterrupted run's exactly when the cell passes - as long as an update
is left after the resume that reads the wrong state. Where none is, the state is the stronger oracle:
a scheduler forgotten just before the last update, anything lost at the last step, a loss scale that
restarts between windows (powers of two: the updates stay exact) are wrong state the final weights
cannot show (see the last test).

Where each bug bites (default case: 8 steps of one micro-batch, the optimizer steps at 2, 4, 6, 8). A
resume from checkpoint k reports what it restored (``run.state(k, ...)`` right after ``run.resumed``),
which is compared with the reference's state after step k: a piece of state left out of the checkpoint
is seen there, at the restored step, as the only component that differs (the rest follows from it at
later steps), the last step included - nothing needs to be trained after it:

* ``no_scheduler``, ``no_optimizer``: once the optimizer has stepped (k >= 2): before, a fresh one is
  the saved one.
* ``no_rng``: at every checkpoint but the last (the model's initialisation and k steps of dropout moved the
  global generator). Its ``rng`` component is a copy of torch's generator, judged as the harness judges
  the generator: by what the resumed run continues with as step k + 1 takes its first inputs, and only
  while the reference draws from it after step k. After the last step nothing draws from it.
* ``lost_accum``: at a checkpoint in the middle of an accumulation window (odd k).
* ``never_resumes``: in auto mode, after every published checkpoint; ``older_checkpoint``: in auto
  mode, once two checkpoint folders are kept. Path mode names the folder, so neither bites there.

In a job killed twice, the first resume that bites decides the verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

import state_bug_trainer as trainer  # noqa: E402

from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.run import KillSpec  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

# torch._dynamo too: the first Adam a process builds imports it (about 3 s), and the fork server
# cannot run a warm-up from the tests folder (it is not on the server's sys.path).
PRELOAD = ("torch", "torch._dynamo")
SEED = 7
PASSED = "PASSED"

#: 8 steps, optimizer steps at 2, 4, 6, 8.
DEFAULT = {}
#: 6 steps, optimizer steps at 3 and 6: a resume after the first micro-batch of a window continues it.
ACCUM3 = {"id": "accum3", "n": 6, "take": 1, "epochs": 1, "accum": 3}

STATE_BUGS = (trainer.no_scheduler, trainer.no_optimizer, trainer.no_rng, trainer.lost_accum)
#: The state bugs the final weights (final.pt: model and EMA) show whenever an update is left after the
#: resume: all but no_scaler (see WEIGHTS_BLIND). test_state_completeness.py judges every cell of the
#: full matrix of the newer ones.
ORACLE_BUGS = (*STATE_BUGS, trainer.no_ema, trainer.save_before_step, trainer.numpy_noise, trainer.ema_final_only)
TARGETS = {fn.__name__: resume_target(fn, name=fn.__name__, steps=trainer.total_steps, preload=PRELOAD)
           for fn in (trainer.correct, trainer.never_resumes, trainer.older_checkpoint, *ORACLE_BUGS,
                      trainer.no_scaler)}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("engine"), seed=SEED)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """No shared first runs and no early stop: the last run of every cell trains to the end and writes
    final.pt. The main engine already proves the references deterministic."""
    return Engine(tmp_path_factory.mktemp("oracle"), seed=SEED, share=False, check_determinism=False)


# -- the sweep -------------------------------------------------------------------------------------

def sweep(case, extras=()):
    """(cell id, kills, prior checkpoints) of a case: a kill right after a checkpoint at every step,
    with a checkpoint at each earlier step too (as the matrix plans them: one shared first run), then
    the ``extras`` named by cell id (see EXTRAS)."""
    last = trainer.total_steps(case)
    singles = [(f"auto-ckpt{k}", (KillSpec(k),), tuple(range(1, k))) for k in range(1, last + 1)]
    return singles + [(cell_id, *EXTRAS[cell_id]) for cell_id in extras]


#: Further cells of the default case: (kills, prior checkpoints). Kills after unsaved steps with no,
#: one and two checkpoints on disk; a double kill; path mode, where each resume is given its folder
#: (path-ckpt5 has step_3 and step_5 on disk and is given step_5).
EXTRAS = {
    "auto-ckpt0+2": ((KillSpec(0, 2),), ()),
    "auto-ckpt3+1": ((KillSpec(3, 1),), ()),
    "auto-ckpt4+1": ((KillSpec(4, 1),), (2,)),
    "auto-ckpt2_ckpt5": ((KillSpec(2), KillSpec(5)), ()),
    "path-ckpt5": ((KillSpec(5),), (3,)),  # step_3 and step_5 on disk, step_5 named
    "path-ckpt2_ckpt5": ((KillSpec(2), KillSpec(5)), ()),
}
#: The control and the checkpoint-choice bugs get every extra cell (the resume modes differ for them);
#: the state bugs, which restore the same folder in both modes, a few.
ALL_EXTRAS = tuple(EXTRAS)
STATE_EXTRAS = ("auto-ckpt3+1", "auto-ckpt2_ckpt5", "path-ckpt5")


def make_cell(fn, case, cell_id, kills, prior=()):
    mode = cell_id.split("-", 1)[0]
    return Cell(TARGETS[fn.__name__], case, mode, kills, trainer.total_steps(case), None, prior)


def run_sweep(engine, fn, case, extras=()):
    """Every cell of the sweep judged, by cell id (first runs shared within a resume mode)."""
    cells = {cell_id: make_cell(fn, case, cell_id, kills, prior) for cell_id, kills, prior in sweep(case, extras)}
    engine.register(list(cells.values()))
    return {cell_id: engine.run_cell(cell) for cell_id, cell in cells.items()}


# -- what a verdict says, in a few words -----------------------------------------------------------

STALE = re.compile(r"STALE_RESUME: run (\d+) (?:started fresh \(resumed step 0\)|resumed from step_\d+ \(step (\d+)\)) "
                   r"but step_(\d+) was published before the kill: (\d+) steps? of training lost$")
DIVERGED = re.compile(r"STATE_DIVERGED at step (\d+) \((?:the restored step of|first step after|\d+ steps after) "
                      r"resume from step_(\d+)\): ([^;]*)")


def stale(run, got, want):
    return f"STALE_RESUME: run {run} from step {got} instead of {want}, {want - got} lost"


def diverged(step, resumed, components):
    return f"STATE_DIVERGED at step {step} after step_{resumed}: {', '.join(sorted(components))}"


def outcome(result):
    """The verdict as ``stale(...)``/``diverged(...)`` words, or its categories and headline when it
    is anything else (so a mismatch shows the whole headline)."""
    verdict = result.verdict
    if verdict.passed:
        return PASSED
    m = STALE.match(verdict.headline)
    if verdict.categories == [vd.STALE_RESUME] and m:
        run, got, want, lost = int(m[1]), int(m[2] or 0), int(m[3]), int(m[4])
        return stale(run, got, want) if lost == want - got else verdict.headline
    m = DIVERGED.match(verdict.headline)
    if verdict.categories == [vd.STATE_DIVERGED] and m:  # the components that differ first (the cause)
        return diverged(int(m[1]), int(m[2]), [part.split(" differs")[0] for part in m[3].split(", ")
                                                 if " differs" in part])
    return f"{verdict.categories}: {verdict.headline}"


# -- where each state bug bites --------------------------------------------------------------------

def bites(bug, case, k):
    """The components that differ at the restored step when ``bug`` resumes from checkpoint k (None:
    they all agree there, and so at every later step: nothing else is wrong)."""
    p = trainer.params(case)
    last, accum = trainer.total_steps(case), p["accum"]
    if k == 0:
        return None  # a fresh start restores nothing: it is the reference's start
    stepped = k >= accum  # the optimizer has stepped: its state and the schedule have moved
    if bug == trainer.NO_SCHEDULER and stepped:
        return {"scheduler"}
    if bug == trainer.NO_OPTIMIZER and stepped:
        return {"optimizer"}
    if bug == trainer.NO_RNG and k < last:  # the fresh generator has drawn the initial weights only
        return {"rng"}
    if bug == trainer.LOST_ACCUM and k % accum and k < last:  # the window's first gradients are missing
        return {"grad_accum"}
    return None


def expected_state(bug, case, kills):
    """The first resume (in run order) where the bug bites decides the verdict, at its restored step."""
    for kill in kills:
        k = kill.checkpoint_step
        differ = bites(bug, case, k)
        if differ:
            return diverged(k, k, differ)
    return PASSED


# -- the control -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "extras"), [(DEFAULT, ALL_EXTRAS), (ACCUM3, ())], ids=["accum2", "accum3"])
def test_the_correct_trainer_passes_every_cell_and_resumes_from_each_kills_checkpoint(engine, case, extras):
    results = run_sweep(engine, trainer.correct, case, extras)
    kills = {cell_id: k for cell_id, k, _ in sweep(case, extras)}
    assert {i: outcome(r) for i, r in results.items()} == {i: PASSED for i in results}
    assert {i: r.verdict.resumed_from for i, r in results.items()} == {
        i: [kill.checkpoint_step for kill in kills[i]] for i in results}


# -- which checkpoint ------------------------------------------------------------------------------

PATH_PASSES = {cell_id: PASSED for cell_id in EXTRAS if cell_id.startswith("path-")}


def test_a_trainer_that_never_finds_its_checkpoint_is_a_stale_resume_wherever_one_was_published(engine):
    results = run_sweep(engine, trainer.never_resumes, DEFAULT, ALL_EXTRAS)
    assert {i: outcome(r) for i, r in results.items()} == {
        **{f"auto-ckpt{k}": stale(2, 0, k) for k in range(1, 9)},
        "auto-ckpt0+2": PASSED,  # nothing was published: a fresh start is right
        "auto-ckpt3+1": stale(2, 0, 3),
        "auto-ckpt4+1": stale(2, 0, 4),
        "auto-ckpt2_ckpt5": stale(2, 0, 2),  # the first resume already started over
        **PATH_PASSES,
    }
    assert results["auto-ckpt8"].verdict.headline == (
        "STALE_RESUME: run 2 started fresh (resumed step 0) but step_8 was published before the kill: "
        "8 steps of training lost")


def test_a_trainer_that_takes_the_older_kept_checkpoint_is_a_stale_resume_once_two_are_kept(engine):
    results = run_sweep(engine, trainer.older_checkpoint, DEFAULT, ALL_EXTRAS)
    assert {i: outcome(r) for i, r in results.items()} == {
        "auto-ckpt1": PASSED,  # one folder on disk: the older one is the newest
        **{f"auto-ckpt{k}": stale(2, k - 1, k) for k in range(2, 9)},
        "auto-ckpt0+2": PASSED,
        "auto-ckpt3+1": PASSED,  # only step_3 on disk
        "auto-ckpt4+1": stale(2, 2, 4),  # step_2 and step_4 on disk
        "auto-ckpt2_ckpt5": stale(3, 2, 5),  # the second resume finds step_2 and step_5
        **PATH_PASSES,
    }
    assert results["auto-ckpt2_ckpt5"].verdict.headline == (
        "STALE_RESUME: run 3 resumed from step_2 (step 2) but step_5 was published before the kill: "
        "3 steps of training lost")


# -- which state -----------------------------------------------------------------------------------

#: One headline per state bug, word for word: the first differing key is named, then the consequences.
#: no_scheduler: step 6 updates with the restored rate, then the fresh schedule sets a wrong one, which
#: step 8's update uses. no_optimizer: step 6 updates with a fresh Adam; step 7's gradients are of other
#: weights. no_rng: step 5 starts with the fresh generator (the copy is named with when it was compared) and
#: draws other dropout masks. lost_accum: step 4 closes a window that lacks step 3's gradients.
HEADLINES = {
    "no_scheduler": ("auto-ckpt4", "STATE_DIVERGED at step 4 (the restored step of resume from step_4): scheduler "
                                   "differs (_last_lr.0), model, optimizer, rng, grad_accum, data, ema and scaler "
                                   "agree; optimizer differs from step 6, model differs from step 8, ema differs from "
                                   "step 8"),
    "no_optimizer": ("auto-ckpt4", "STATE_DIVERGED at step 4 (the restored step of resume from step_4): optimizer "
                                   "differs (param_groups.0.lr), model, scheduler, rng, grad_accum, data, ema and "
                                   "scaler agree; model differs from step 6, ema differs from step 6, grad_accum "
                                   "differs from step 7"),
    "no_rng": ("auto-ckpt4", "STATE_DIVERGED at step 4 (the restored step of resume from step_4): rng differs (as step "
                             "5 took its first inputs), model, optimizer, scheduler, grad_accum, data, ema and scaler "
                             "agree; torch CPU RNG (captured by the harness) differs from step 5, grad_accum differs "
                             "from step 5, model differs from step 6, optimizer differs from step 6, ema differs from "
                             "step 6"),
    "lost_accum": ("auto-ckpt3", "STATE_DIVERGED at step 3 (the restored step of resume from step_3): grad_accum "
                                 "differs (0), model, optimizer, scheduler, rng, data, ema and scaler agree; model "
                                 "differs from step 4, optimizer differs from step 4, ema differs from step 4"),
}


@pytest.mark.parametrize("fn", STATE_BUGS, ids=lambda fn: fn.__name__)
def test_a_piece_of_state_left_out_of_the_checkpoint_diverges_exactly_where_it_can_bite(engine, fn):
    results = run_sweep(engine, fn, DEFAULT, STATE_EXTRAS)
    kills = {cell_id: k for cell_id, k, _ in sweep(DEFAULT, STATE_EXTRAS)}
    assert {i: outcome(r) for i, r in results.items()} == {
        i: expected_state(fn.__name__, DEFAULT, kills[i]) for i in results}
    cell_id, headline = HEADLINES[fn.__name__]
    assert results[cell_id].verdict.headline == headline


def test_gradients_lost_in_an_open_window_are_named_grad_accum_at_the_restored_step(engine):
    results = run_sweep(engine, trainer.lost_accum, ACCUM3)
    assert {i: outcome(r) for i, r in results.items()} == {
        "auto-ckpt1": diverged(1, 1, {"grad_accum"}),  # the window holds step 1's gradients
        "auto-ckpt2": diverged(2, 2, {"grad_accum"}),  # and steps 1 and 2's
        "auto-ckpt3": PASSED,  # a window boundary: nothing accumulated to lose
        "auto-ckpt4": diverged(4, 4, {"grad_accum"}),
        "auto-ckpt5": diverged(5, 5, {"grad_accum"}),
        "auto-ckpt6": PASSED,
    }
    # The weights follow when the window closes (step 3), not before.
    assert results["auto-ckpt1"].verdict.headline == (
        "STATE_DIVERGED at step 1 (the restored step of resume from step_1): grad_accum differs (0), model, "
        "optimizer, scheduler, rng, data, ema and scaler agree; model differs from step 3, optimizer differs from "
        "step 3, ema differs from step 3")


# -- the oracle: final weights ---------------------------------------------------------------------

#: Cells with an update left after every resume: a restart from scratch (every bug passes), ckpt1
#: (before the first update: no_rng, lost_accum and numpy_noise fail), ckpt3 (every bug fails but
#: save_before_step: step 3 does not update) and a double kill (every bug fails; lost_accum and
#: ema_final_only only at the second resume).
ORACLE_CELLS = [("auto-ckpt0+2", (KillSpec(0, 2),)), ("auto-ckpt1", (KillSpec(1),)), ("auto-ckpt3", (KillSpec(3),)),
                ("auto-ckpt2_ckpt5", (KillSpec(2), KillSpec(5)))]


def final_weights_equal(result):
    """Whether the last run's final.pt (model and EMA weights) equals the reference's, tensor for tensor,
    bit for bit."""
    import torch

    last = result.runs[-1]
    assert last.outcome == "done", last.describe()
    ours = torch.load(Path(last.plan.checkpoint_dir) / trainer.FINAL_FILE, weights_only=True)
    ref = torch.load(Path(result.reference.plan.checkpoint_dir) / trainer.FINAL_FILE, weights_only=True)
    assert ours.keys() == ref.keys()
    return all(torch.equal(ours[key], ref[key]) for key in ref)


@pytest.mark.parametrize("fn", ORACLE_BUGS, ids=lambda fn: fn.__name__)
def test_state_diverges_exactly_when_the_final_weights_differ_from_the_uninterrupted_run(oracle, fn):
    seen = []
    for cell_id, kills in ORACLE_CELLS:
        result = oracle.run_cell(make_cell(fn, DEFAULT, cell_id, kills))
        assert result.verdict.categories in ([], [vd.STATE_DIVERGED]), (cell_id, result.verdict.headline)
        assert final_weights_equal(result) == result.passed, (cell_id, result.verdict.headline)
        seen.append(result.passed)
    assert True in seen and False in seen  # both directions of the "exactly when" were tried


def test_a_stale_resume_redoes_the_lost_work_so_the_final_weights_still_match(oracle):
    # The verdict is not about the weights: a resume from scratch or from an older checkpoint with its
    # whole state restored trains the same steps again and ends bit for bit where the reference ends.
    # What it lost is the work (steps trained twice), which only the choice of checkpoint shows.
    for fn, cell_id, kills, prior, lost in [
        (trainer.never_resumes, "auto-ckpt3", (KillSpec(3),), (), 3),
        (trainer.older_checkpoint, "auto-ckpt3", (KillSpec(3),), (1, 2), 1),
        (trainer.older_checkpoint, "auto-ckpt2_ckpt5", (KillSpec(2), KillSpec(5)), (), 3),
    ]:
        result = oracle.run_cell(make_cell(fn, DEFAULT, cell_id, kills, prior))
        assert result.verdict.categories == [vd.STALE_RESUME], result.verdict.headline
        assert result.verdict.headline.endswith(f": {lost} step{'s' if lost > 1 else ''} of training lost")
        assert final_weights_equal(result)


#: (bug, checkpoint, the component named first, whether the final weights show it): wrong state that
#: no later update reads, or reads without effect. The weights are a weaker oracle than the state; in
#: these cells the state verdict is right and the weights cannot tell - but a longer run would train
#: with that state.
WEIGHTS_BLIND = [
    # Resumed from step 6 or 7, the fresh schedule sets a wrong rate only after the last update that
    # reads one (step 8 uses the optimizer's restored rate); resumed from step 8, nothing is left to run.
    (trainer.no_scheduler, 6, "scheduler", False),
    (trainer.no_scheduler, 7, "scheduler", False),
    (trainer.no_scheduler, 8, "scheduler", False),
    (trainer.no_optimizer, 8, "optimizer", False),
    # The scale is a power of two: a window scaled and unscaled by one scale gives the exact update,
    # whichever scale it is. Step 3's window began with the scale a fresh scaler has (only its growth
    # tracker differs); step 4 ends a window. From step 5, the window began with twice the fresh scale:
    # the update that finishes it with the fresh one differs - the weights show that one.
    (trainer.no_scaler, 3, "scaler", False),
    (trainer.no_scaler, 4, "scaler", False),
    (trainer.no_scaler, 8, "scaler", False),
    (trainer.no_scaler, 5, "scaler", True),
]


@pytest.mark.parametrize(("fn", "k", "component", "weights_show_it"), WEIGHTS_BLIND,
                         ids=[f"{fn.__name__}-ckpt{k}" for fn, k, _, _ in WEIGHTS_BLIND])
def test_state_diverges_where_the_final_weights_cannot_show_it(oracle, fn, k, component, weights_show_it):
    result = oracle.run_cell(make_cell(fn, DEFAULT, f"auto-ckpt{k}", (KillSpec(k),)))
    assert result.verdict.categories == [vd.STATE_DIVERGED], result.verdict.headline
    assert result.verdict.headline.startswith(
        f"STATE_DIVERGED at step {k} (the restored step of resume from step_{k}): {component} differs")
    if fn in STATE_BUGS:
        assert outcome(result) == expected_state(fn.__name__, DEFAULT, (KillSpec(k),))
    assert final_weights_equal(result) != weights_show_it


def test_a_generator_nothing_draws_from_after_a_resume_at_the_last_step_fails_no_cell(oracle):
    # The copy of torch's generator that no_rng reports is judged as the generator: after the last step
    # nothing draws from it, so it cannot change what the job trains or delivers (the final weights agree).
    result = oracle.run_cell(make_cell(trainer.no_rng, DEFAULT, "auto-ckpt8", (KillSpec(8),)))
    assert result.passed, result.verdict.headline
    assert final_weights_equal(result)
