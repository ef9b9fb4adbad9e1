"""The state verdicts for one-process trainers: every piece of state a checkpoint can lose fails exactly the cells
of the target's full matrix where it can bite, as ``STATE_DIVERGED`` naming that piece first, and the
correct trainer passes every cell; quick mode (shared first runs, early stop) and exhaustive mode
(``share=False``) give the same verdict, word for word, in every cell.

The trainer is ``state_bug_trainer`` (8 steps of one micro-batch, two epochs of 4 steps, the optimizer
steps at 2, 4, 6 and 8). Its full matrix (``cells(target, FULL, seed)``, 31 cells) resumes from every
step, the last one included, one unsaved step after checkpoints 1 to 6 (odd ones: in the middle of an
accumulation window), from scratch, twice in one job, and in path mode. A resume from checkpoint k
reports what it restored (``run.state(k, ...)``), compared with the reference's state after step k,
then every later step; so a bug that loses a piece of state is seen at the restored step k itself:

* ``no_optimizer``, ``no_scheduler``, ``no_ema``, ``no_scaler``: once the optimizer has stepped
  (k >= 2; before, the fresh state is the saved one), the last step included.
* ``lost_accum``: in the middle of an accumulation window (odd k); the last step closes its window.
* ``save_before_step``: after a step that updates (even k, the last included): the checkpoint holds
  the weights from before the update. ``model`` is named first: every component the update moves
  (model, optimizer, scheduler, grad_accum, ema, scaler) differs, named in the trainer's order.
* ``numpy_noise`` reports no state: only the numpy generator the harness captures shows it, at the
  restored step k as step k + 1 takes its first inputs - and not at the last step (nothing left that
  draws from it).
* ``ema_final_only`` never reports its EMA per step: only the final outputs show it, after a last
  resume from k >= 2 (the EMA restarts in every run: it is never saved).

In a job killed twice the first resume that bites decides the verdict (the final outputs: the last).
A target that reports final outputs is never stopped early, so quick mode differs from exhaustive mode
there only by its shared first runs. Without them (case ``nofinal``, for the control and two bugs)
quick mode stops a resumed run whose state meets the reference's at the epoch's end (step 4), and the
verdicts are the same all the same.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import state_bug_trainer as trainer  # noqa: E402

from pytest_resume_check.cells.matrix import FULL, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records.names import case_id  # noqa: E402
from pytest_resume_check.records.results import Outcome  # noqa: E402
from pytest_resume_check.records.state import CAPTURED_NUMPY  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

PRELOAD = ("torch", "torch._dynamo")
SEED = 7
PASSED = "PASSED"

DEFAULT = {}
#: The same job without ``run.final``: quick mode may stop a resumed run early.
NO_FINAL = {"id": "nofinal", "final": False}
LAST = trainer.total_steps(DEFAULT)
ACCUM = trainer.params(DEFAULT)["accum"]
#: The step after which the reference's next step takes the next epoch's inputs only.
EPOCH_END = trainer.params(DEFAULT)["n"] // trainer.params(DEFAULT)["take"]

#: Each planted bug and the component its headline names first.
FIRST = {
    trainer.no_optimizer: "optimizer",
    trainer.no_scheduler: "scheduler",
    trainer.no_ema: "ema",
    trainer.no_scaler: "scaler",
    trainer.save_before_step: "model",
    trainer.lost_accum: "grad_accum",
    trainer.numpy_noise: CAPTURED_NUMPY,
    trainer.ema_final_only: "ema",
}
#: The bugs a resume at the last step still shows (lost_accum: the last step closes its window;
#: numpy_noise: no step is left to draw from the generator).
BITE_AT_THE_LAST_STEP = ("no_optimizer", "no_scheduler", "no_ema", "no_scaler", "save_before_step", "ema_final_only")
FUNCTIONS = (trainer.correct, *FIRST)
#: The targets that also run without final outputs, where quick mode stops early: the control, and a bug
#: that bites in some cells of each resume kind (no_ema) and one that bites at every other step (lost_accum).
EARLY_STOPPING = (trainer.correct, trainer.no_ema, trainer.lost_accum)
TARGETS = {fn.__name__: resume_target(fn, name=fn.__name__, steps=trainer.total_steps, preload=PRELOAD,
                                      cases=[DEFAULT, NO_FINAL] if fn in EARLY_STOPPING else [DEFAULT])
           for fn in FUNCTIONS}
#: (target function, case): every case of every target.
JOBS = [(fn, case) for fn in FUNCTIONS for case in (DEFAULT, NO_FINAL) if case in TARGETS[fn.__name__].cases]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("quick"), seed=SEED)


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("exhaustive"), seed=SEED, share=False)


# -- where each bug bites ----------------------------------------------------------------------------

def restored(cell):
    """The checkpoint step each resumed run restores, in run order (0: a fresh start)."""
    return [kill.checkpoint_step for kill in cell.kills]


def bites_at(name, k):
    """The first compared step whose state shows bug ``name`` after a resume from checkpoint k, or None."""
    if k == 0:
        return None  # nothing restored: the fresh start is the reference's
    stepped = k >= ACCUM  # the optimizer, schedule, EMA and scaler have moved since the start
    window_open = k % ACCUM != 0 and k < LAST  # gradients of a half-finished window are in the checkpoint
    if name in ("no_optimizer", "no_scheduler", "no_ema", "no_scaler") and stepped:
        return k
    if name == "lost_accum" and window_open:
        return k
    if name == "save_before_step" and not window_open:  # step k updated after its checkpoint was captured
        return k
    if name == "numpy_noise" and k < LAST:  # seen as the next step takes its first inputs, if one is left
        return k
    return None


def expected(name, case, cell):
    """The headline up to its first ``differs`` (or PASSED) that bug ``name`` must give in ``cell``."""
    resumes = restored(cell)
    if name == "ema_final_only":
        if case.get("final", True) and resumes[-1] >= ACCUM:
            return f"STATE_DIVERGED in the final outputs (after resume from step_{resumes[-1]}): ema differs"
        return PASSED
    for k in resumes:
        step = bites_at(name, k)
        if step is not None:
            when = "the restored step of" if step == k else "first step after"
            first = FIRST[getattr(trainer, name)]
            return f"STATE_DIVERGED at step {step} ({when} resume from step_{k}): {first} differs"
    return PASSED


def said(result):
    """The verdict in the words of :func:`expected`, or its categories and whole headline otherwise."""
    verdict = result.verdict
    if verdict.passed:
        return PASSED
    if verdict.categories == [vd.STATE_DIVERGED] and " differs" in verdict.headline:
        return verdict.headline[:verdict.headline.index(" differs")] + " differs"
    return f"{verdict.categories}: {verdict.headline}"


def first_component(headline):
    """The component a headline names first: after the first ``): `` up to `` differs``."""
    rest = headline.split("): ", 1)[1]
    return rest[:rest.index(" differs")]


def matrix(name, case):
    """The cells of the target's full matrix for ``case``."""
    return [cell for cell in cells(TARGETS[name], FULL, SEED) if cell.case_id == case_id(case)]


def judge_all(engine, name, case):
    """Every cell of the target's full matrix for ``case``, judged, by cell id."""
    chosen = matrix(name, case)
    engine.register(chosen)
    return {cell.id: (cell, engine.run_cell(cell)) for cell in chosen}


# -- the tests ---------------------------------------------------------------------------------------

def test_the_full_matrix_holds_the_cells_the_issue_asks_for():
    ids = {cell.kill_id for cell in matrix("correct", DEFAULT)}
    assert f"ckpt{LAST}" in ids and f"ckpt{LAST - 1}_ckpt{LAST}" in ids  # resumes at the last step
    assert {"ckpt1+1", "ckpt3+1", "ckpt5+1"} <= ids  # in the middle of an accumulation window
    assert sum("_" in i for i in ids) >= 7  # killed twice: the second kill in the resumed run
    assert len(matrix("correct", DEFAULT)) == 31


@pytest.mark.parametrize(("fn", "case"), JOBS, ids=[f"{fn.__name__}-{case_id(case)}" for fn, case in JOBS])
def test_every_cell_fails_exactly_where_the_bug_bites_naming_it_first_in_quick_and_exhaustive_mode(
        quick, exhaustive, fn, case):
    name = fn.__name__
    fast = judge_all(quick, name, case)
    slow = judge_all(exhaustive, name, case)
    assert {i: said(r) for i, (_, r) in fast.items()} == {
        i: expected(name, case, cell) for i, (cell, _) in fast.items()}
    # Word for word, the consequences after the first difference included.
    assert {i: (r.verdict.categories, r.verdict.headline) for i, (_, r) in slow.items()} == {
        i: (r.verdict.categories, r.verdict.headline) for i, (_, r) in fast.items()}
    for cell_id, (cell, result) in fast.items():
        assert result.verdict.resumed_from == restored(cell), cell_id
        assert slow[cell_id][1].runs[-1].outcome == Outcome.DONE, cell_id  # exhaustive: no early stop
        if not result.passed:
            assert first_component(result.verdict.headline) == FIRST[fn], (cell_id, result.verdict.headline)
            if fn is trainer.numpy_noise:
                k = next(k for k in restored(cell) if bites_at("numpy_noise", k) is not None)
                assert (f"{CAPTURED_NUMPY} differs (captured by the harness, as step {k + 1} took its first inputs)"
                        in result.verdict.headline), (cell_id, result.verdict.headline)
        # Final outputs (and no reported state at all) rule the early stop out; without them a run whose
        # state meets the reference's at the epoch's end stops there.
        stops = not case.get("final", True) and result.passed and restored(cell)[-1] < EPOCH_END
        assert result.runs[-1].outcome == (Outcome.CONVERGED if stops else Outcome.DONE), cell_id
        if stops:
            assert result.runs[-1].converged_step == EPOCH_END, cell_id
    if fn is trainer.correct:
        assert all(r.passed for _, r in fast.values())
    elif case == DEFAULT:
        assert not all(r.passed for _, r in fast.values())


@pytest.mark.parametrize("fn", [getattr(trainer, name) for name in BITE_AT_THE_LAST_STEP], ids=lambda fn: fn.__name__)
def test_a_resume_at_the_last_step_still_shows_the_bug(quick, fn):
    # Nothing is left to train: only the restored step (or the final outputs) can show what was lost.
    cell = next(c for c in matrix(fn.__name__, DEFAULT) if c.kill_id == f"ckpt{LAST}")
    result = quick.run_cell(cell)
    assert result.verdict.categories == [vd.STATE_DIVERGED], result.verdict.headline
    where = (f"in the final outputs (after resume from step_{LAST})" if fn is trainer.ema_final_only
             else f"at step {LAST} (the restored step of resume from step_{LAST})")
    assert result.verdict.headline.startswith(f"STATE_DIVERGED {where}: {FIRST[fn]} differs")
