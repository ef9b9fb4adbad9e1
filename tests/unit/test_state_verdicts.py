"""Pure tests of state digests and of the verdicts on what a resume restored (no processes, no torch):
which checkpoint (STALE_RESUME, PROTOCOL) and which training state (STATE_DIVERGED, NONDETERMINISTIC)."""

from __future__ import annotations

import pytest

from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import events as ev
from pytest_resume_check.records import state as st
from pytest_resume_check.records.plan import RESUME_DISABLED, RESUME_PATH, KillSpec, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord
from pytest_resume_check.targets import Contract, TargetError, resume_target


def consumed(step, *ids, epoch=0):
    return ev.Event(ev.CONSUMED, step=step, epoch=epoch, ids=ids)


def published(step):
    return ev.Event(ev.CHECKPOINT, step=step, path=f"/ckpt/step_{step}")


def resumed(step):
    return ev.Event(ev.RESUMED, step=step, path=f"/ckpt/step_{step}" if step else None)


def state(step, **components):
    """A state event as RunContext.state sends it, from plain values."""
    leaves = {name: st.leaf_digests(value) for name, value in components.items()}
    digests = {name: st.combine(values) for name, values in leaves.items()}
    return ev.Event(ev.STATE, step=step, extra={ev.STATE_DIGESTS: digests, ev.STATE_LEAVES: leaves})


def record(events, outcome=Outcome.DONE, resume_mode="auto", kill=None, is_resume=False):
    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/ckpt", "/tmp/x.log", resume_mode=resume_mode, kill=kill,
                   is_resume=is_resume)
    return RunRecord(plan, list(events), outcome, 0)


#: Steps 1..6, two inputs each.
INPUTS = {s: (2 * s - 2, 2 * s - 1) for s in range(1, 7)}


def steps(first, last, states=None):
    out = []
    for s in range(first, last + 1):
        out += [consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s)]
        if states is not None:
            out.append(states(s))
    return out


def model(s, lr=0.1):
    return state(s, model={"w": [float(s), 2.0 * s]}, optimizer={"state": {"0": {"exp_avg": [s / 10]}},
                                                                  "param_groups": [{"lr": lr}]})


REFERENCE = record(steps(1, 6, model))


def first_run(kill_after=4, publish=(2, 4)):
    events = []
    for s in range(1, kill_after + 1):
        events += [consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s)]
        if s in publish:
            events.append(published(s))
    return record(events, Outcome.KILLED, kill=KillSpec(max(publish, default=0), kill_after - max(publish, default=0)))


def resumed_run(step, states=model, mode="auto"):
    return record([resumed(step), *steps(step + 1, 6, states)], Outcome.DONE, resume_mode=mode, is_resume=True)


# -- which checkpoint ------------------------------------------------------------------------------

def test_a_fresh_start_after_a_published_checkpoint_is_a_stale_resume_with_the_work_lost():
    verdict = vd.judge(REFERENCE, [first_run(), resumed_run(0)], Contract())
    assert verdict.categories == [vd.STALE_RESUME]
    assert verdict.headline == ("STALE_RESUME: run 2 started fresh (resumed step 0) but step_4 was published "
                                "before the kill: 4 steps of training lost")


def test_resuming_the_older_of_two_checkpoints_is_a_stale_resume():
    verdict = vd.judge(REFERENCE, [first_run(), resumed_run(2)], Contract())
    assert verdict.categories == [vd.STALE_RESUME]
    assert verdict.headline == ("STALE_RESUME: run 2 resumed from step_2 (step 2) but step_4 was published "
                                "before the kill: 2 steps of training lost")


@pytest.mark.parametrize("mode", ["auto", RESUME_PATH])
def test_resuming_the_newest_published_checkpoint_passes(mode):
    assert vd.judge(REFERENCE, [first_run(), resumed_run(4, mode=mode)], Contract()).passed


def test_a_fresh_start_when_nothing_was_published_passes():
    assert vd.judge(REFERENCE, [first_run(3, publish=()), resumed_run(0)], Contract()).passed


def test_a_run_told_not_to_resume_may_start_fresh():
    assert vd.judge(REFERENCE, [first_run(), resumed_run(0, mode=RESUME_DISABLED)], Contract()).passed


def test_a_resume_from_a_step_no_run_reached_is_a_protocol_error():
    killed = record([*steps(1, 4), published(2)], Outcome.KILLED, kill=KillSpec(2, 2))
    verdict = vd.judge(REFERENCE, [killed, resumed_run(5)], Contract())
    assert verdict.categories[0] == vd.PROTOCOL
    assert verdict.headline == vd.MSG_UNPUBLISHED.format(run=2, step=5, reached=4)


def test_the_second_resume_of_a_double_kill_must_take_the_newest_checkpoint_of_either_run():
    second = record([resumed(4), *steps(5, 5, model), published(5)], Outcome.KILLED, kill=KillSpec(5), is_resume=True)
    runs = [first_run(), second, resumed_run(4)]
    verdict = vd.judge(REFERENCE, runs, Contract())
    assert verdict.categories == [vd.STALE_RESUME]
    assert verdict.headline.startswith("STALE_RESUME: run 3 resumed from step_4 (step 4) but step_5 was published")


def test_a_crash_cell_keeps_its_own_rule_for_the_first_resume():
    # The faulted save of step 4 completed on disk but was never published: resuming it is right.
    assert not vd.judge(REFERENCE, [first_run(4, publish=(2,)), resumed_run(4)], Contract(),
                        newest_complete=4).findings
    verdict = vd.judge(REFERENCE, [first_run(4, publish=(2,)), resumed_run(2)], Contract(), newest_complete=4)
    assert verdict.categories == [vd.STALE_RESUME]
    assert "newest checkpoint whose save completed before the crash" in verdict.headline


# -- which state -----------------------------------------------------------------------------------

def lost_optimizer(s):
    """The optimizer's moments start from zero after the resume; the model follows one step later."""
    fresh = {"state": {"0": {"exp_avg": [0.0]}}, "param_groups": [{"lr": 0.1}]}
    w = {"w": [float(s), 2.0 * s]} if s == 5 else {"w": [s + 0.5, 2.0 * s]}
    return state(s, model=w, optimizer=fresh)


def test_state_that_differs_after_a_resume_names_the_step_components_and_first_key():
    verdict = vd.judge(REFERENCE, [first_run(), resumed_run(4, lost_optimizer)], Contract())
    assert verdict.categories == [vd.STATE_DIVERGED]
    assert verdict.headline == ("STATE_DIVERGED at step 5 (first step after resume from step_4): optimizer "
                                "differs (state.0.exp_avg.0), model agrees; model differs from step 6")


def test_a_scheduler_that_was_not_restored_shows_in_the_learning_rate():
    verdict = vd.judge(REFERENCE, [first_run(), resumed_run(4, lambda s: model(s, lr=0.2))], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 5 (first step after resume from step_4): optimizer "
                                "differs (param_groups.0.lr), model agrees")


def test_state_that_differs_only_where_the_inputs_do_is_not_a_second_finding():
    wrong = record([resumed(4), consumed(5, 8), model(5), *steps(6, 6, model)], Outcome.DONE, is_resume=True)
    other_state = record([resumed(4), consumed(5, 8), state(5, model={"w": [0.0]}), *steps(6, 6, model)], Outcome.DONE,
                         is_resume=True)
    assert vd.judge(REFERENCE, [first_run(), wrong], Contract()).categories == [vd.LOST]
    assert vd.judge(REFERENCE, [first_run(), other_state], Contract()).categories == [vd.LOST]


def test_a_restored_state_that_differs_is_the_cause_named_before_the_inputs_it_loses():
    # The buffer of step 4's unused inputs is not in the checkpoint: the restored state shows it, then the
    # ledger shows which inputs were lost.
    def buffered(s, kept=(9,)):
        return state(s, model={"w": [float(s), 2.0 * s]}, buffer=list(kept))

    reference = record([e for s in range(1, 7) for e in (consumed(s, *INPUTS[s]), ev.Event(ev.STEP_END, step=s),
                                                          buffered(s))])
    lossy = record([resumed(4), buffered(4, kept=()), consumed(5, 8), ev.Event(ev.STEP_END, step=5), buffered(5),
                    *steps(6, 6, buffered)], Outcome.DONE, is_resume=True)
    verdict = vd.judge(reference, [first_run(), lossy], Contract())
    assert verdict.categories == [vd.LOST, vd.STATE_DIVERGED]
    assert [f.category for f in verdict.findings] == [vd.STATE_DIVERGED, vd.LOST]
    assert verdict.headline == ("STATE_DIVERGED at step 4 (the restored step of resume from step_4): buffer differs "
                                "(0), model agrees")
    assert verdict.state_diverged == 4


def test_a_generator_that_differs_where_the_inputs_already_differ_follows_the_input_findings():
    # Only the generator captured as step 5 takes its inputs differs, and step 5 takes other inputs: the data
    # path may have moved it as well as followed from it, so it is said after the inputs, not as their cause.
    reference = record([e for s in range(1, 7) for e in with_rng(s)])
    events = [resumed(4), state(4, model={"w": [4.0]}, rng=torch_rng(4)),
              generators(4, b"moved-by-the-replay", before_next=True), consumed(5, 8),
              generators(5, torch_rng(5)), ev.Event(ev.STEP_END, step=5),
              state(5, model={"w": [5.0]}, rng=torch_rng(5))]
    events += [e for s in (6,) for e in with_rng(s)[1:]]
    verdict = vd.judge(reference, [first_run(), record(events, Outcome.DONE, is_resume=True)], Contract())
    assert [f.category for f in verdict.findings] == [vd.LOST, vd.STATE_DIVERGED]
    assert verdict.findings[1].headline == (
        "STATE_DIVERGED at step 4 (the restored step of resume from step_4): torch CPU RNG differs (captured by the "
        "harness, as step 5 took its first inputs), model and rng agree")


def test_a_converged_run_agrees_with_the_reference():
    run = record([resumed(4), consumed(5, *INPUTS[5]), model(5), ev.Event(ev.CONVERGED, step=5)], Outcome.CONVERGED,
                 is_resume=True)
    assert vd.judge(REFERENCE, [first_run(), run], Contract()).passed


def test_a_component_one_side_does_not_report_differs():
    verdict = vd.judge(REFERENCE, [first_run(), resumed_run(4, lambda s: state(s, model={"w": [float(s), 2.0 * s]}))],
                       Contract())
    assert verdict.headline.endswith("optimizer differs (not reported), model agrees")


def test_reference_runs_whose_states_differ_are_nondeterministic_naming_the_component():
    other = record(steps(1, 6, lambda s: model(s) if s < 3 else model(s, lr=0.3)))
    findings = vd.judge_reference(REFERENCE, other, None, Contract())
    assert [f.category for f in findings] == [vd.NONDETERMINISTIC]
    assert findings[0].headline.startswith("NONDETERMINISTIC reference: two uninterrupted runs differ in their "
                                           "state from step 3: optimizer differs (param_groups.0.lr), model agrees")
    assert "state_tolerance=(rtol, atol)" in findings[0].headline


def test_under_a_tolerance_the_childs_comparison_decides():
    def compared(s):
        return ev.Event(ev.STATE, step=s, extra={ev.STATE_COMPARED: {"model": None,
                                                                     "optimizer": "state.0" if s > 5 else None}})
    ref = record(steps(1, 6, lambda s: ev.Event(ev.STATE, step=s, extra={ev.STATE_COMPARED: {}})))
    verdict = vd.judge(ref, [first_run(), resumed_run(4, compared)], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 6 (2 steps after resume from step_4): optimizer differs "
                                "(state.0), model agrees")


# -- digests and values ----------------------------------------------------------------------------

class Stateful:
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value, "nested": [1, {"b": 2, "a": 3}]}


def test_objects_are_flattened_through_their_state_dict_with_sorted_keys():
    assert list(st.flatten({"m": Stateful(5)})) == [("m.nested.0", 1), ("m.nested.1.a", 3), ("m.nested.1.b", 2),
                                                    ("m.value", 5)]


@pytest.mark.parametrize("a, b", [(1, 1.0), (1, True), ("1", 1), (b"x", "x"), (0.1, 0.1 + 1e-16), ([1], [1, 2])])
def test_leaf_digests_tell_types_and_values_apart(a, b):
    assert st.leaf_digests(a) != st.leaf_digests(b)


def test_lists_and_tuples_digest_alike_as_a_saved_and_loaded_state_may_turn_one_into_the_other():
    assert st.leaf_digests({"betas": (0.9, 0.999)}) == st.leaf_digests({"betas": [0.9, 0.999]})


def test_first_differing_key_names_a_changed_or_missing_leaf():
    assert st.first_differing_key({"a": "1", "b": "2"}, {"a": "1", "b": "3"}) == "b"
    assert st.first_differing_key({"a": "1"}, {"a": "1", "c": "9"}) == "c"
    assert st.first_differing_key({"a": "1"}, {"a": "1"}) is None


def test_values_close_under_a_tolerance_and_not_beyond_it():
    assert st.first_not_close({"a": 1.0, "b": 2.0}, {"a": 1.0 + 1e-9, "b": 2.0}, 1e-6, 0.0) is None
    assert st.first_not_close({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.1}, 1e-6, 0.0) == "b"
    assert st.first_not_close({"a": float("nan")}, {"a": float("nan")}, 0.0, 0.0) is None
    assert st.first_not_close({"a": "x"}, {"a": "y"}, 1.0, 1.0) == "a"
    assert st.first_not_close({}, {"extra": 1}, 0.0, 0.0) == "extra"


@pytest.mark.parametrize("bad", [(1e-5,), (-1, 0), ("a", "b"), (float("inf"), 0), 0.1])
def test_a_bad_state_tolerance_is_a_clear_target_error(bad):
    with pytest.raises(TargetError, match=r"state_tolerance=.* is not \(rtol, atol\)"):
        resume_target(test_a_bad_state_tolerance_is_a_clear_target_error, steps=3, state_tolerance=bad)


def test_a_checkpoint_complete_on_disk_but_not_yet_published_at_the_kill_may_be_resumed():
    # A background saver finished step_4 on disk; its publication had not reached the harness yet.
    killed = record([*steps(1, 5), published(2)], Outcome.KILLED, kill=KillSpec(2, 3))
    assert vd.judge(REFERENCE, [killed, resumed_run(4)], Contract()).passed


# -- digest kinds -----------------------------------------------------------------------

@pytest.fixture
def without_xxhash(monkeypatch):
    """This process's digests as where ``xxhash`` is not installed (SHA-256)."""
    import sys

    monkeypatch.setitem(sys.modules, "xxhash", None)  # import xxhash raises ImportError
    st._hasher.cache_clear()
    yield
    st._hasher.cache_clear()


def test_a_digest_says_its_kind(monkeypatch):
    import sys

    pytest.importorskip("xxhash")
    st._hasher.cache_clear()
    fast = st.leaf_digest([1.0, 2.0])
    assert fast.startswith(st.XXH3_PREFIX) and st.digest_kind(fast) == st.KIND_XXH3
    assert len(fast) == len(st.XXH3_PREFIX) + st.DIGEST_CHARS
    monkeypatch.setitem(sys.modules, "xxhash", None)
    st._hasher.cache_clear()
    try:
        plain = st.leaf_digest([1.0, 2.0])
    finally:
        st._hasher.cache_clear()
    assert st.digest_kind(plain) == st.KIND_SHA256 and len(plain) == st.DIGEST_CHARS


def test_a_numpy_leaf_is_digested_by_its_values_whatever_its_memory_layout():
    np = pytest.importorskip("numpy")
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert st.leaf_digest(grid[:, ::2]) == st.leaf_digest(np.ascontiguousarray(grid[:, ::2]))
    assert st.leaf_digest(grid.T) != st.leaf_digest(grid)  # another shape
    assert st.leaf_digest(np.array(3.0)) != st.leaf_digest(np.array(4.0))  # 0-d arrays too


def test_states_digested_with_two_kinds_are_refused_not_called_diverged(without_xxhash):
    """A program whose interpreter lacks xxhash digests its own leaves with SHA-256 (the client's leaves):
    compared with a reference digested with XXH3 every leaf would differ, whatever the state."""
    resumed_events = [resumed(4), *steps(5, 6, model)]  # SHA-256 leaves
    st._hasher.cache_clear()
    reference_leaves = record([e if e.kind != ev.STATE else state(e.step, tag="x3") for e in REFERENCE.events])
    fake_fast = {"x": st.XXH3_PREFIX + "0" * st.DIGEST_CHARS}
    for event in reference_leaves.events:
        if event.kind == ev.STATE:
            event.extra[ev.STATE_LEAVES] = {"tag": fake_fast}
    verdict = vd.judge(reference_leaves, [first_run(), record(resumed_events, is_resume=True)], Contract())
    assert verdict.categories == [vd.PROTOCOL]
    assert verdict.headline == st_verdict_message(2, "sha256", "xxh3-128")
    same_kind = record(steps(1, 6, model))  # SHA-256 too: judged as before
    assert vd.judge(same_kind, [first_run(), record(resumed_events, is_resume=True)], Contract()).passed


def st_verdict_message(run, got, want):
    from pytest_resume_check.judge.state_verdict import MSG_DIGEST_KINDS

    return MSG_DIGEST_KINDS.format(run=run, got=got, want=want)


# -- generators at the restored step -----------------------------------------------------------------

def generators(step, torch_rng, numpy_rng=b"numpy", before_next=False):
    """The harness's capture of the process-global generators (bytes stand in for their states): at
    ``step``'s end, or (``before_next``) as step ``step + 1`` takes its first inputs."""
    components = {st.CAPTURED_TORCH: torch_rng, st.CAPTURED_NUMPY: {"state": {"key": numpy_rng}}}
    leaves = {name: st.leaf_digests(value) for name, value in components.items()}
    extra = {ev.STATE_DIGESTS: {name: st.combine(v) for name, v in leaves.items()}, ev.STATE_LEAVES: leaves}
    if before_next:
        extra[ev.STATE_BEFORE_NEXT] = True
    return ev.Event(ev.STATE, step=step, extra=extra)


def torch_rng(s):
    """torch's generator after step ``s`` (each step draws from it)."""
    return f"torch-rng-{s}".encode()


def with_rng(s, rng=None):
    """The run's events of one step as a trainer that reports its rng copy makes them, with the harness's
    captures: the first inputs, the step's end, the state."""
    rng = torch_rng(s) if rng is None else rng
    return [generators(s - 1, torch_rng(s - 1), before_next=True), consumed(s, *INPUTS[s]),
            generators(s, torch_rng(s)), ev.Event(ev.STEP_END, step=s),
            state(s, model={"w": [float(s)]}, rng=rng)]


RNG_REFERENCE = record([e for s in range(1, 7) for e in with_rng(s)])


def rng_resume(k, restored_for_next, report_at_restore=b"fresh-generator", later=None):
    """A run resumed from step k that reports its rng copy right after restoring (``report_at_restore``: the
    generator before the trainer restored it) and continues with ``restored_for_next`` as step k + 1 takes
    its first inputs."""
    events = [resumed(k), state(k, model={"w": [float(k)]}, rng=report_at_restore),
              generators(k, restored_for_next, before_next=True)]
    for s in range(k + 1, 7):
        events += with_rng(s, later)[1:]
    return record(events, Outcome.DONE, is_resume=True)


def test_a_generator_restored_after_the_resumed_iterator_started_is_no_finding():
    # The trainer reports its copy of torch's generator before restoring it (it restores it once its loader's
    # iterator drew a base seed): what it continues with as step 5 takes its inputs is the reference's.
    verdict = vd.judge(RNG_REFERENCE, [first_run(), rng_resume(4, torch_rng(4))], Contract())
    assert verdict.passed, verdict.headline


def test_a_generator_copy_never_restored_is_named_where_the_next_step_takes_its_inputs():
    verdict = vd.judge(RNG_REFERENCE, [first_run(), rng_resume(4, b"fresh-generator", later=b"wrong")], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 4 (the restored step of resume from step_4): rng differs "
                                "(as step 5 took its first inputs), model agrees")


def test_a_generator_copy_at_the_last_step_nothing_draws_from_after_fails_nothing():
    reference = record([e for s in range(1, 7) for e in with_rng(s)])
    run = record([resumed(6), state(6, model={"w": [6.0]}, rng=b"fresh-generator")], Outcome.DONE, is_resume=True)
    assert vd.judge(reference, [first_run(kill_after=6, publish=(6,)), run], Contract()).passed


def test_a_generator_of_the_trainers_own_is_compared_at_the_restored_step_as_reported():
    # A torch.Generator the trainer owns is no process-global generator: the harness sees it only in the
    # report, so the report right after restoring is what is compared.
    def own(s, rng=None):
        return [*with_rng(s)[:-1], state(s, model={"w": [float(s)]}, rng=rng or f"own-{s}".encode())]

    reference = record([e for s in range(1, 7) for e in own(s)])
    events = [resumed(4), state(4, model={"w": [4.0]}, rng=b"fresh"), generators(4, torch_rng(4), before_next=True)]
    events += [e for s in (5, 6) for e in own(s)[1:]]
    verdict = vd.judge(reference, [first_run(), record(events, Outcome.DONE, is_resume=True)], Contract())
    assert verdict.headline == ("STATE_DIVERGED at step 4 (the restored step of resume from step_4): rng differs, "
                                "model agrees")


def test_the_rank_whose_generator_differs_is_named_not_the_ranks_whose_model_follows_it():
    def ranked(events, rank):
        return [ev.Event(e.kind, step=e.step, epoch=e.epoch, ids=e.ids, path=e.path, extra=e.extra, rank=rank)
                for e in events]

    def job(model_after, numpy_before):
        out = []
        for rank in (0, 1):
            for s in range(1, 7):
                out += ranked([generators(s - 1, torch_rng(s - 1), numpy_before(rank, s - 1), before_next=True),
                               consumed(s, *INPUTS[s]), generators(s, torch_rng(s), numpy_before(rank, s)),
                               ev.Event(ev.STEP_END, step=s), state(s, model={"w": [model_after(s)]})], rank)
        return out

    reference = record(job(float, lambda rank, s: f"np-{rank}-{s}".encode()))
    resumed_events = []
    for rank in (0, 1):
        resumed_events += ranked([resumed(4), state(4, model={"w": [4.0]}),
                                  generators(4, torch_rng(4), f"np-0-{4}".encode(), before_next=True)], rank)
        for s in (5, 6):  # both ranks' models differ after step 5: the all-reduce spreads rank 1's noise
            resumed_events += ranked([consumed(s, *INPUTS[s]), generators(s, torch_rng(s), f"np-0-{s}".encode()),
                                      ev.Event(ev.STEP_END, step=s), state(s, model={"w": [s + 0.5]})], rank)
    killed = first_run()
    killed = record(ranked(killed.events, 0) + ranked(killed.events, 1), Outcome.KILLED, kill=killed.plan.kill)
    verdict = vd.judge(reference, [killed, record(resumed_events, Outcome.DONE, is_resume=True)], Contract())
    assert verdict.headline == (
        "STATE_DIVERGED at step 4 on rank 1 (the restored step of resume from step_4): numpy global RNG differs "
        "(captured by the harness, as step 5 took its first inputs), model agrees; model differs from step 5")


def test_a_headline_names_a_few_components_of_each_list_and_counts_the_rest():
    from pytest_resume_check.judge.state_verdict import HEADLINE_NAMES, describe

    agree = [f"layers.{i}.weight" for i in range(40)]
    later = {f"layers.{i}.bias": 6 for i in range(12)}
    text = describe({"optimizer": "state.0.exp_avg"}, agree, later)
    assert text.startswith("optimizer differs (state.0.exp_avg), layers.0.weight, ")
    assert f"layers.{HEADLINE_NAMES - 2}.weight and {40 - HEADLINE_NAMES + 1} more agree; " in text
    assert text.endswith(f"layers.{HEADLINE_NAMES - 2}.bias differs from step 6, {12 - HEADLINE_NAMES + 1} more "
                         "differ later")
    assert len(text) < 500 and "layers.39" not in text and "layers.11" not in text
    # Short lists are named whole, as before.
    assert describe({"model": "w"}, ["optimizer", "rng"], {}) == "model differs (w), optimizer and rng agree"
