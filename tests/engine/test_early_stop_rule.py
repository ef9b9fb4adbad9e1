"""The default early-stop rule (``early_stop="epoch"``: a resumed run whose reported state equals
the reference's stops only at a step that ends an epoch) changes no verdict, even for a trainer whose
report misses state it cannot see (its loader workers' generators); stopping at the first equal step
(``early_stop="any"``) does change verdicts there.

The trainer is ``worker_rng_target``: one process over a ``StatefulDataLoader`` with two workers, 12
inputs in batches of 2, two epochs of 6 steps; each sample carries noise drawn from its worker's torch
generator. It restores and reports everything it can see (model, optimizer, the loader's position, the
epoch, the global RNG), but torchdata 0.11 starts a loader's workers from the start of their generators
when it resumes in the middle of an epoch (docs/findings.md), so the samples after the resume carry
other noise. Only the weights trained on it show that: ``noise_every_step`` trains on the noise at every
step, ``noise_every_third_step`` at steps 3, 6, 9 and 12 only.

Every cell of each variant's full matrix (``cells(target, FULL, seed)``: a kill after every checkpoint,
one unsaved step after most, two kills in one job, path mode) is run in quick mode (shared first runs,
early stop) and exhaustive mode (``share=False``), and:

* the verdicts (categories and headline) are the same in both modes, word for word;
* a job that resumes in the middle of an epoch fails as ``STATE_DIVERGED`` naming ``model`` first, at
  the step that first trains on other noise (:func:`bites_at`), while the loader's position, the epoch
  and the RNG agree; resumes at an epoch's end and fresh starts pass;
* declared ``early_stop="any"``, ``noise_every_third_step`` passes in quick mode cells that fail
  exhaustively (its state equals the reference's at the step after the resume, before the other noise
  is trained on): the epoch rule is what makes the two modes agree.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

import worker_rng_target as trainer  # noqa: E402

from pytest_resume_check.cells.matrix import FULL, cells  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records.plan import EARLY_STOP_ANY, EARLY_STOP_EPOCH  # noqa: E402
from pytest_resume_check.records.results import Outcome  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402

SEED = 7
PASSED = "PASSED"
LAST = trainer.total_steps()
PER_EPOCH = trainer.PER_EPOCH
#: What every failing headline says of the state the trainer reports besides the model and optimizer.
DATA_AGREES = "loader, epoch and rng agree"

#: Each target function and the variant it trains.
VARIANTS = {trainer.noise_every_step: trainer.EVERY_STEP, trainer.noise_every_third_step: trainer.EVERY_THIRD_STEP}
#: The steps at which a quick-mode resumed run may stop under each rule (exhaustive mode: none): the epoch
#: rule only after a step whose next step takes the next epoch's inputs, so never at the last step.
STOP_STEPS = {
    EARLY_STOP_EPOCH: [end for end in trainer.epoch_boundaries() if end < LAST],
    EARLY_STOP_ANY: list(range(1, LAST + 1)),
}
EXHAUSTIVE = ()


def declare(fn, early_stop=EARLY_STOP_EPOCH):
    """The target of ``fn`` under an early-stop rule (named after the rule unless it is the default)."""
    name = fn.__name__ if early_stop == EARLY_STOP_EPOCH else f"{fn.__name__}_{early_stop}"
    return resume_target(fn, name=name, steps=trainer.total_steps, boundaries=trainer.epoch_boundaries,
                         preload=trainer.PRELOAD, early_stop=early_stop)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("quick"), seed=SEED)


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("exhaustive"), seed=SEED, share=False)


# -- where other noise is trained on ------------------------------------------------------------------

def restored(cell):
    """The checkpoint step each resumed run restores, in run order (0: a fresh start)."""
    return [kill.checkpoint_step for kill in cell.kills]


def other_noise(k, step):
    """Whether the samples of ``step`` carry other noise after a resume from checkpoint k than in the
    reference. Batch b of an epoch is loaded by worker b % WORKERS, each worker drawing on from the start
    of its generator; the resumed workers start at the checkpoint's position, so a worker's draws are the
    reference's only if its first batch after the resume is also its first of the epoch."""
    epoch, position = divmod(k, PER_EPOCH)
    if position == 0 or (step - 1) // PER_EPOCH != epoch:
        return False  # new workers for a new epoch, from a base seed of the restored global RNG: the same
    worker = (step - 1) % PER_EPOCH % trainer.WORKERS
    first = next(b for b in range(position, PER_EPOCH) if b % trainer.WORKERS == worker)
    return first >= trainer.WORKERS


def bites_at(variant, k):
    """The first step after a resume from checkpoint k that trains on other noise (the model differs from
    there), or None."""
    return next((step for step in range(k + 1, LAST + 1)
                 if other_noise(k, step) and trainer.uses_noise(variant, step)), None)


def diverged(step, k):
    """The headline up to its first ``differs`` for a model that differs at ``step`` after a resume from k."""
    when = "the restored step of" if step == k else "first step after" if step == k + 1 else f"{step - k} steps after"
    return f"STATE_DIVERGED at step {step} ({when} resume from step_{k}): model differs"


def expected(variant, cell, stops):
    """(what the verdict says in the words of :func:`said`, the step the last run stops at or None) for
    ``cell`` when the last run may stop at ``stops``. A run killed at step s reports its state up to step
    s - 1 (the trainer reports after it checkpoints, and the kill comes at the checkpoint or the step's
    end); a model that differs by the next checkpoint is restored by the next run."""
    resumes = restored(cell)
    last_reported = [kill.kill_step - 1 for kill in cell.kills[1:]] + [LAST]
    carried = False
    for index, (k, until) in enumerate(zip(resumes, last_reported)):
        if carried:
            return diverged(k, k), None
        step = bites_at(variant, k)
        if index == len(resumes) - 1:
            stop = next((s for s in stops if s > k), None)
            if stop is not None and (step is None or step > stop):
                return PASSED, stop
        if step is not None and step <= until:
            return diverged(step, k), None
        carried = step is not None and index + 1 < len(resumes) and step <= resumes[index + 1]
    return PASSED, None


def said(result):
    """The verdict in the words of :func:`expected`, or its categories and whole headline otherwise."""
    verdict = result.verdict
    if verdict.passed:
        return PASSED
    if verdict.categories == [vd.STATE_DIVERGED] and " differs" in verdict.headline:
        return verdict.headline[:verdict.headline.index(" differs")] + " differs"
    return f"{verdict.categories}: {verdict.headline}"


def judge_all(engine, target):
    """Every cell of the target's full matrix, judged, by cell id."""
    chosen = cells(target, FULL, SEED)
    engine.register(chosen)
    return {cell.id: (cell, engine.run_cell(cell)) for cell in chosen}


def words(results):
    """Each cell's verdict, word for word: its categories and whole headline."""
    return {cell_id: (result.verdict.categories, result.verdict.headline) for cell_id, (_, result) in results.items()}


# -- the tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", list(VARIANTS), ids=lambda fn: fn.__name__)
def test_quick_and_exhaustive_mode_agree_and_fail_exactly_the_mid_epoch_resumes(quick, exhaustive, fn):
    variant = VARIANTS[fn]
    target = declare(fn)
    fast = judge_all(quick, target)
    slow = judge_all(exhaustive, target)
    assert {i: said(r) for i, (_, r) in fast.items()} == {
        i: expected(variant, cell, STOP_STEPS[EARLY_STOP_EPOCH])[0] for i, (cell, _) in fast.items()}
    # Word for word, the components that agree and the consequences included.
    assert words(slow) == words(fast)
    for cell_id, (cell, result) in fast.items():
        assert result.verdict.resumed_from == restored(cell), cell_id
        mid_epoch = any(k % PER_EPOCH for k in restored(cell))
        assert result.passed is not mid_epoch, (cell_id, result.verdict.headline)
        if mid_epoch:
            # Nothing the trainer reports about its data shows the cause; the weights trained on it do.
            assert DATA_AGREES in result.verdict.headline, (cell_id, result.verdict.headline)
        stop = expected(variant, cell, STOP_STEPS[EARLY_STOP_EPOCH])[1]
        assert result.runs[-1].outcome == (Outcome.CONVERGED if stop else Outcome.DONE), cell_id
        assert result.runs[-1].converged_step == stop, cell_id
        assert slow[cell_id][1].runs[-1].outcome == Outcome.DONE, cell_id  # exhaustive: no early stop
    assert any(not r.passed for _, r in fast.values()) and any(r.passed for _, r in fast.values())


def test_stopping_at_any_equal_step_passes_cells_that_fail_exhaustively(quick, exhaustive):
    fn = trainer.noise_every_third_step
    variant = VARIANTS[fn]
    target = declare(fn, EARLY_STOP_ANY)
    fast = judge_all(quick, target)
    assert {i: said(r) for i, (_, r) in fast.items()} == {
        i: expected(variant, cell, STOP_STEPS[EARLY_STOP_ANY])[0] for i, (cell, _) in fast.items()}
    for cell_id, (cell, result) in fast.items():
        stop = expected(variant, cell, STOP_STEPS[EARLY_STOP_ANY])[1]
        assert result.runs[-1].converged_step == stop, cell_id
    # A pass under "any" that fails exhaustively is a verdict the shortcut changed: run every pass to the end.
    passes = [cell for cell, result in fast.values() if result.passed]
    exhaustive.register(passes)
    changed = {cell.id: said(result) for cell in passes if not (result := exhaustive.run_cell(cell)).passed}
    assert changed, "no verdict changed: the test no longer shows why the default rule waits for an epoch's end"
    assert changed == {cell.id: expected(variant, cell, EXHAUSTIVE)[0] for cell in passes
                       if expected(variant, cell, EXHAUSTIVE)[0] != PASSED}
    assert all(fast[cell_id][1].runs[-1].outcome == Outcome.CONVERGED for cell_id in changed)
