"""Pure tests of the state verdicts at the restored step (no processes, no torch): the restored step
is compared, the cause comes first, every rank is judged, a captured generator counts only while the
reference draws from it, the final outputs are compared, and the early stop waits for an epoch's end."""

from __future__ import annotations

from test_state_verdicts import INPUTS, REFERENCE, consumed, first_run, model, published, record, resumed, state

from pytest_resume_check.cells.references import Reference, epoch_ends
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.ledger import step_inputs_digest
from pytest_resume_check.records.plan import EARLY_STOP_ANY, EARLY_STOP_NEVER
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.records.state import CAPTURED_NUMPY, CAPTURED_PYTHON, combine, leaf_digests
from pytest_resume_check.targets import Contract, TargetError, resume_target


def run_from(step, states=model, restored=None, last=6, outcome=Outcome.DONE, extra=()):
    """A resumed run of steps ``step + 1`` to ``last``; ``restored``: the state it reports right after
    restoring (None: it reports none there)."""
    events = [resumed(step)]
    if restored is not None:
        events.append(restored(step))
    for s in range(step + 1, last + 1):
        events += [consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s), states(s)]
    return record([*events, *extra], outcome, is_resume=True)


def killed_at(step):
    return first_run(kill_after=step, publish=(step,))


# -- the restored step -----------------------------------------------------------------------------

def test_the_state_reported_right_after_restoring_is_compared_with_the_references_at_that_step():
    def no_optimizer(s):
        return model(s) if s > 4 else state(s, model={"w": [float(s), 2.0 * s]}, optimizer={"state": {}})
    verdict = vd.judge(REFERENCE, [killed_at(4), run_from(4, restored=no_optimizer)], Contract())
    assert verdict.headline.startswith("STATE_DIVERGED at step 4 (the restored step of resume from step_4): "
                                       "optimizer differs (")
    assert verdict.headline.endswith("model agrees")


def test_a_restore_at_the_last_step_is_judged():
    def stale_model(s):
        return state(s, model={"w": [0.0, 0.0]})
    verdict = vd.judge(REFERENCE, [killed_at(6), run_from(6, restored=stale_model)], Contract())
    assert verdict.categories == [vd.STATE_DIVERGED]
    assert verdict.headline == "STATE_DIVERGED at step 6 (the restored step of resume from step_6): model differs (w.0)"


def test_at_the_restored_step_only_what_the_resumed_run_reports_there_is_compared():
    def model_only(s):
        return state(s, model={"w": [float(s), 2.0 * s]})
    assert vd.judge(REFERENCE, [killed_at(4), run_from(4, restored=model_only)], Contract()).passed


def test_a_state_reported_before_the_restored_step_is_not_compared():
    verdict = vd.judge(REFERENCE, [killed_at(4), run_from(4, extra=[state(3, model={"w": [9.0]})])], Contract())
    assert verdict.passed


# -- the cause first -------------------------------------------------------------------------------

def accumulated(s, grads):
    return state(s, model={"w": [float(s)]}, grad_accum={"0": [grads]})


def test_gradients_lost_at_the_restore_are_named_first_and_the_model_follows():
    reference = record([x for s in range(1, 7) for x in (consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s),
                                                         accumulated(s, s % 2))])
    def resumed_state(s):  # the restore dropped step 3's gradients: the update of step 4 differs, then all
        return accumulated(s, 0) if s == 3 else state(s, model={"w": [s + 0.5]}, grad_accum={"0": [s % 2]})
    verdict = vd.judge(reference, [killed_at(3), run_from(3, resumed_state, restored=resumed_state)], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 3 (the restored step of resume from step_3): grad_accum "
                                "differs (0.0), model agrees; model differs from step 4")


# -- every rank ------------------------------------------------------------------------------------

def ranked(event, rank):
    return ev.Event(event.kind, event.step, event.epoch, event.ids, event.path, event.text, event.extra, rank)


def two_ranks(events_of):
    return [ranked(e, r) for r in (0, 1) for e in events_of(r)]


def test_each_rank_is_compared_with_the_same_rank_and_the_headline_names_it():
    def rank_state(rank, wrong=False):
        return lambda s: state(s, model={"w": [float(s)]}, rng={"seed": rank * 100 + s + (7 if wrong and s > 4 else 0)})
    ref_events = two_ranks(lambda r: [x for s in range(1, 7) for x in (consumed(s, 2 * s + r),
                                                                      ev.Event(ev.STEP_END, step=s), rank_state(r)(s))])
    reference = record(ref_events)
    first = record(two_ranks(lambda r: [x for s in range(1, 5) for x in (consumed(s, 2 * s + r), ev.Event(
        ev.STEP_END, step=s))] + [published(4)]), Outcome.KILLED)
    resumed_events = two_ranks(lambda r: [resumed(4)] + [x for s in range(5, 7) for x in (
        consumed(s, 2 * s + r), ev.Event(ev.STEP_END, step=s), rank_state(r, wrong=r == 1)(s))])
    verdict = vd.judge(reference, [first, record(resumed_events, is_resume=True)], Contract())
    assert verdict.categories == [vd.STATE_DIVERGED], verdict.headline
    assert verdict.headline.startswith("STATE_DIVERGED at step 5 on rank 1 (first step after resume from step_4): "
                                       "rng differs (seed)")


# -- captured generators ---------------------------------------------------------------------------

def captured(s, name, value):
    leaves = {name: leaf_digests(value)}
    return ev.Event(ev.STATE, step=s, extra={ev.STATE_DIGESTS: {name: combine(leaves[name])}, ev.STATE_LEAVES: leaves})


def with_generator(values, name=CAPTURED_NUMPY):
    return lambda s: [model(s), captured(s, name, values(s))]


def run_events(first, last, states):
    return [x for s in range(first, last + 1) for x in (consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s),
                                                        *states(s))]


def test_a_captured_generator_the_reference_draws_from_fails_naming_the_harness():
    reference = record(run_events(1, 6, with_generator(lambda s: s)))
    resumed_run = record([resumed(4), *run_events(5, 6, with_generator(lambda s: s + 100))], is_resume=True)
    verdict = vd.judge(reference, [killed_at(4), resumed_run], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 5 (first step after resume from step_4): numpy global RNG "
                                "differs (captured by the harness), model and optimizer agree")


def test_a_captured_generator_nobody_draws_from_after_the_restore_does_not_fail():
    reference = record(run_events(1, 6, with_generator(lambda s: min(s, 3))))  # drawn up to step 3 only
    resumed_run = record([resumed(4), *run_events(5, 6, with_generator(lambda s: 100))], is_resume=True)
    assert vd.judge(reference, [killed_at(4), resumed_run], Contract()).passed


def test_reference_runs_differ_in_an_undrawn_generator_without_being_nondeterministic():
    a = record(run_events(1, 6, with_generator(lambda s: 1, CAPTURED_PYTHON)))  # Python reseeds random at fork
    b = record(run_events(1, 6, with_generator(lambda s: 2, CAPTURED_PYTHON)))
    assert vd.judge_reference(a, b, None, Contract()) == []
    drawn = record(run_events(1, 6, with_generator(lambda s: s + 10, CAPTURED_PYTHON)))
    findings = vd.judge_reference(drawn, record(run_events(1, 6, with_generator(lambda s: s, CAPTURED_PYTHON))),
                                  None, Contract())
    assert [f.category for f in findings] == [vd.NONDETERMINISTIC]
    assert "python random differs (captured by the harness)" in findings[0].headline


# -- final outputs ---------------------------------------------------------------------------------

def final(**components):
    leaves = {name: leaf_digests(value) for name, value in components.items()}
    return ev.Event(ev.FINAL, extra={ev.STATE_DIGESTS: {n: combine(v) for n, v in leaves.items()},
                                     ev.STATE_LEAVES: leaves})


def test_final_outputs_that_differ_fail_even_when_every_step_agrees():
    reference = record([*REFERENCE.events, final(model=[1.0], ema=[0.5])])
    resumed_run = run_from(4, extra=[final(model=[1.0], ema=[0.25])])
    verdict = vd.judge(reference, [killed_at(4), resumed_run], Contract())
    assert verdict.headline == ("STATE_DIVERGED in the final outputs (after resume from step_4): ema differs (0), "
                                "model agrees")
    assert vd.judge(reference, [killed_at(4), run_from(4, extra=[final(model=[1.0], ema=[0.5])])], Contract()).passed


def test_final_outputs_the_last_run_never_reports_differ():
    reference = record([*REFERENCE.events, final(model=[1.0])])
    verdict = vd.judge(reference, [killed_at(4), run_from(4)], Contract())
    assert verdict.headline.endswith("model differs (not reported)")


def test_final_outputs_of_a_job_whose_inputs_differ_are_their_consequence():
    reference = record([*REFERENCE.events, final(model=[1.0])])
    lossy = record([resumed(4), consumed(5, 8), model(5), consumed(6, *INPUTS[6]), model(6), final(model=[2.0])],
                   is_resume=True)
    assert vd.judge(reference, [killed_at(4), lossy], Contract()).categories == [vd.LOST]


# -- the early stop --------------------------------------------------------------------------------

def epochs_run(per_epoch, epochs, states=model):
    events = []
    for s in range(1, per_epoch * epochs + 1):
        events += [consumed(s, s, epoch=(s - 1) // per_epoch), ev.Event(ev.STEP_END, step=s), states(s)]
    return record(events)


def test_a_resumed_run_may_stop_only_at_the_end_of_an_epoch_by_default():
    run = epochs_run(3, 2)
    assert epoch_ends(run) == {3}
    assert list(Reference(run, []).converge) == [3]
    assert list(Reference(run, [], early_stop=EARLY_STOP_ANY).converge) == [1, 2, 3, 4, 5, 6]
    assert Reference(run, [], early_stop=EARLY_STOP_NEVER).converge == {}


def test_no_early_stop_for_a_target_that_reports_final_outputs_or_only_captured_generators():
    assert Reference(record([*epochs_run(3, 2).events, final(model=[1.0])]), []).converge == {}
    only_captured = epochs_run(3, 2, lambda s: captured(s, CAPTURED_NUMPY, s))
    assert Reference(only_captured, [], early_stop=EARLY_STOP_ANY).converge == {}


def test_the_early_stop_waits_for_a_captured_generator_only_while_the_reference_draws_from_it():
    drawn_to_step_4 = record([*epochs_run(3, 2).events, *(captured(s, CAPTURED_NUMPY, min(s, 4)) for s in range(1, 7))])
    converge = Reference(drawn_to_step_4, [], early_stop=EARLY_STOP_ANY).converge
    assert CAPTURED_NUMPY in converge[3] and CAPTURED_NUMPY not in converge[4]


def test_the_early_stop_knows_the_inputs_of_each_step_up_to_the_one_after_its_last_stop():
    run = epochs_run(3, 2)
    inputs = Reference(run, []).converge_inputs
    assert list(inputs) == [1, 2, 3, 4]  # the stop at 3 waits for step 4's first inputs
    assert inputs[4] == step_inputs_digest([(4, 1)]) != step_inputs_digest([(4, 0)])  # the epoch counts
    assert step_inputs_digest([(1, 0), (2, 0)]) == step_inputs_digest([(2, 0), (1, 0)])
    assert list(Reference(run, [], early_stop=EARLY_STOP_ANY).converge_inputs) == [1, 2, 3, 4, 5, 6]  # none after 6
    assert Reference(run, [], early_stop=EARLY_STOP_NEVER).converge_inputs == {}


def test_a_bad_early_stop_is_a_clear_target_error():
    def train(run):
        pass
    train.__qualname__ = "train"
    try:
        resume_target(train, steps=2, early_stop="sometimes")
    except TargetError as exc:
        assert "early_stop='sometimes'" in str(exc) and "'epoch'" in str(exc)
    else:
        raise AssertionError("no error")


# -- elastic cells ---------------------------------------------------------------------------------

def test_an_elastic_resume_is_state_judged_only_for_a_state_that_does_not_depend_on_the_world_size():
    from dataclasses import replace

    def world(rec, size, elastic_state=False):
        return replace(rec, plan=replace(rec.plan, world_size=size, elastic_state=elastic_state))

    def replicated(s, w=None):
        return state(s, model={"w": [float(s) if w is None else w]})
    ref_events = two_ranks(lambda r: [x for s in range(1, 7) for x in (consumed(s, 2 * s + r),
                                                                      ev.Event(ev.STEP_END, step=s), replicated(s))])
    first = world(record(two_ranks(lambda r: [x for s in range(1, 5) for x in (
        consumed(s, 2 * s + r), ev.Event(ev.STEP_END, step=s))] + [published(4)]), Outcome.KILLED), 2)
    one_rank = [resumed(4)] + [x for s in range(5, 7) for x in (consumed(s, 2 * s, 2 * s + 1),
                                                               ev.Event(ev.STEP_END, step=s), replicated(s, 0.0))]
    resumed_run = world(record(one_rank, is_resume=True), 1)
    contract = Contract(ordered=False)
    assert vd.judge(world(record(ref_events), 2), [first, resumed_run], contract).passed  # the elastic contract only
    verdict = vd.judge(world(record(ref_events), 2, elastic_state=True), [first, resumed_run], contract)
    assert verdict.categories == [vd.STATE_DIVERGED]
    assert verdict.headline.startswith("STATE_DIVERGED at step 5 (first step after resume from step_4): model differs")
