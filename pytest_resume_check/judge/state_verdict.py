"""Judge what a resumed run restored: the checkpoint it chose and the training state it continued with.

*Which checkpoint.* The harness saw every checkpoint the runs before a resume published. A resumed
run must restore the last one (in ``auto`` mode the newest in its directory, in ``path`` mode the one
it was given): a fresh start or an older checkpoint is ``STALE_RESUME``, with the steps of training
lost; a step beyond any step the runs before it reached is ``PROTOCOL``. In a crash cell the first resume is judged
by the crash-consistency rule instead (the newest checkpoint whose save completed before the fault).

*Which state.* After each resume, the state the run reports (``run.state``) is compared with the
reference's at the same step, on every rank against the same rank: at the restored step (what the
checkpoint gave back, when the run reports it right after restoring) and at every later step. The
earliest difference is ``STATE_DIVERGED``, naming the components that differ there (the cause, with
their first differing key), those that agree, and the later steps from which the agreeing ones differ
too (the consequences). The process-global generators the harness captures at step ends count only
while the reference still draws from them. What the job delivers (``run.final``) is compared at the end.
The two reference runs are compared the same way: a difference there is ``NONDETERMINISTIC``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_resume_check.categories import NONDETERMINISTIC, PROTOCOL, STALE_RESUME, STATE_DIVERGED
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RESUME_DISABLED, SIGNAL_TERM
from pytest_resume_check.records.results import Finding, Outcome, RunRecord, StepState
from pytest_resume_check.records.state import CAPTURED, GENERATOR_BODY, digest_kind, drawn_after, first_differing_key

MSG_STALE = ("STALE_RESUME: run {run} resumed from {got} but {want} was the newest checkpoint whose save "
             "completed before the crash ({why}); the work saved since is trained again")
MSG_STALE_PUBLISHED = ("STALE_RESUME: run {run} {got} but {want} was published before the kill: {lost} {unit}{s} "
                       "of training lost")
MSG_UNPUBLISHED = ("PROTOCOL: run {run} reported resuming from step {step}, but no run before it got past step "
                   "{reached}; report the step of the checkpoint actually loaded")
MSG_STATE_DIVERGED = "STATE_DIVERGED at {step} ({when} {label}): {what}"
MSG_FINAL_DIVERGED = "STATE_DIVERGED in the final outputs{where} (after {label}): {what}"
#: A final output the interrupted job did not deliver, in :data:`MSG_FINAL_DIVERGED`'s ``what``.
MSG_OUTPUT_MISSING = "{name} is missing (expected at {where})"
MSG_FINAL_NONDETERMINISTIC = (
    "NONDETERMINISTIC reference: two uninterrupted runs deliver different final outputs: {what}; seed every "
    "random source from run.seed, or declare state_tolerance=(rtol, atol) on the target")
MSG_STATE_NONDETERMINISTIC = (
    "NONDETERMINISTIC reference: two uninterrupted runs differ in their state from step {step}: {what}; seed "
    "every random source from run.seed (torch, numpy, random, loader workers), or declare "
    "state_tolerance=(rtol, atol) on the target if its kernels are not bitwise deterministic")

MSG_RANKS_DISAGREE = ("STALE_RESUME: rank {rank} of run {run} resumed from {got} but rank 0 resumed from {want}: "
                      "the ranks of one job continue from different checkpoints")
MSG_PREEMPTED = ("STALE_RESUME: run {run} got SIGTERM at the end of step {step} and {what} within its {grace:g} s "
                 "grace period; run {next} {got}: {lost} step{s} of training lost. A trainer that saves on SIGTERM "
                 "must publish that checkpoint before the grace period ends")

MSG_DIGEST_KINDS = ("PROTOCOL: run {run} digested its state with {got} but the reference run with {want}, so the two "
                    "cannot be compared; give the program's interpreter what the one running pytest has (pip "
                    "install xxhash), or take it from both")

#: Shown as the key of a component one side did not report at that step.
NOT_REPORTED = "not reported"


def checkpoint_name(step: int, path: str | None, unit: str = "step") -> str:
    """``global_step_4`` (the folder's name), ``checkpoint_3 (step 4)`` (a name whose last number is not the
    step it holds: Accelerate numbers its folders from 0) or ``the checkpoint of step 4``. ``unit``:
    ``checkpoint`` where the steps are a program's checkpoints (a zero-change target: ``step_10.pt
    (checkpoint 5)``)."""
    if not path:
        return f"the checkpoint of {unit} {step}"
    name = os.path.basename(os.path.normpath(path))
    numbers = re.findall(r"\d+", name)
    return name if numbers and int(numbers[-1]) == step else f"{name} ({unit} {step})"


def checkpoint_and_step(step: int, path: str | None, unit: str = "step") -> str:
    """``step_9 (step 9)``: :func:`checkpoint_name` with the step it holds, said once."""
    name = checkpoint_name(step, path, unit)
    return name if not path or name.endswith(f"({unit} {step})") else f"{name} ({unit} {step})"


def step_unit(rec: RunRecord) -> str:
    """What a step of ``rec``'s target is: ``checkpoint`` for a zero-change program, whose steps are the
    checkpoints it publishes, else ``step``."""
    return step_unit_of(rec.plan)


def step_unit_of(declared: Any) -> str:
    """:func:`step_unit` of a target or a run's plan (either carries the ``command`` it runs, or None)."""
    command = declared.command
    return "checkpoint" if command is not None and command.checkpoints is not None else "step"


def judge_restored(runs: Sequence[RunRecord], newest_complete: int | None = None) -> list[Finding]:
    """The first resumed run that restored something other than what it was entitled to (empty if none).

    ``newest_complete``: in a crash cell, the checkpoint the first resume is entitled to (see
    :func:`pytest_resume_check.cells.interrupted.newest_complete`).
    """
    published: list[tuple[int, str | None]] = []
    for index in range(1, len(runs)):
        published.extend(runs[index - 1].published)
        rec = runs[index]
        got = rec.resumed_step
        if got is None:
            return []  # the ledger's composition reports the missing report
        preempted = _preempted(runs[index - 1], rec, index)
        if preempted is not None:
            return [preempted]
        if index == 1 and newest_complete is not None:
            if got < newest_complete:
                name = checkpoint_name(got, rec.resumed_path) if got else "scratch"
                return [Finding(STALE_RESUME, MSG_STALE.format(
                    run=2, got=name, want=f"the checkpoint of step {newest_complete}", why=runs[0].describe()),
                    step=got)]
            continue
        if rec.plan.resume_mode == RESUME_DISABLED:
            continue
        # Not "a step nobody published": a background saver may complete a checkpoint on disk whose
        # publication had not reached the harness when the kill came. A step no run reached is wrong.
        reached = max((r.last_step for r in runs[:index]), default=0)
        if got > reached:
            return [Finding(PROTOCOL, MSG_UNPUBLISHED.format(run=index + 1, step=got, reached=reached))]
        if published and got < published[-1][0]:
            want_step, want_path = published[-1]
            unit = step_unit(rec)
            what = (f"resumed from {checkpoint_and_step(got, rec.resumed_path, unit)}" if got
                    else "started fresh (resumed step 0)")
            lost = want_step - got
            return [Finding(STALE_RESUME, MSG_STALE_PUBLISHED.format(
                run=index + 1, got=what, want=checkpoint_name(want_step, want_path, unit), lost=lost, unit=unit,
                s="" if lost == 1 else "s"), step=got)]
    return []


def judge_ranks_agree(runs: Sequence[RunRecord]) -> Finding | None:
    """The first resumed multi-rank run whose ranks restored different checkpoints. Judged before how
    the runs ended: ranks that continue from different steps usually fail in a collective soon after,
    and that error is the consequence, not the cause."""
    for index, rec in enumerate(runs):
        finding = _ranks_disagree(rec, index) if index else None
        if finding is not None:
            return finding
    return None


def _ranks_disagree(rec: RunRecord, index: int) -> Finding | None:
    """A multi-rank run whose ranks restored different checkpoints."""
    by_rank = rec.resumed_by_rank
    lead = by_rank.get(0)
    for rank, (step, path) in by_rank.items():
        if lead is not None and step != lead[0]:
            return Finding(STALE_RESUME, MSG_RANKS_DISAGREE.format(
                rank=rank, run=index + 1, got=checkpoint_and_step(step, path),
                want=checkpoint_and_step(*lead)), step=min(step, lead[0]))
    return None


def _preempted(before: RunRecord, rec: RunRecord, index: int) -> Finding | None:
    """A run sent SIGTERM that published no checkpoint of the step it was preempted in (or later)
    before its grace period ended, so its successor lost that work."""
    signalled = before.signalled
    if signalled is None or signalled.extra.get("signal") != SIGNAL_TERM:
        return None
    at = before.events.index(signalled)
    after = before.events[at + 1:]
    step = signalled.step or 0
    published = [e for e in after if e.kind == ev.CHECKPOINT and not e.rank and (e.step or 0) >= step]
    if published:
        return None  # the resume is judged against it like any other published checkpoint
    more = sum(1 for e in after if e.kind == ev.STEP_END and not e.rank)
    if more:
        what = f"published no checkpoint: it ignored the signal and trained {more} more step{'s' if more > 1 else ''}"
    elif before.exitcode not in (None, 0) and not any(e.kind == ev.DONE for e in after):
        what = "published no checkpoint: it died of the signal without saving"
    else:
        what = "published no checkpoint"
    got = rec.resumed_step or 0
    resumed = (f"resumed from {checkpoint_and_step(got, rec.resumed_path)}" if got
               else "started fresh (resumed step 0)")
    lost = max(step - got, 0)
    return Finding(STALE_RESUME, MSG_PREEMPTED.format(
        run=index, step=step, what=what, grace=float(signalled.extra.get("grace", 0)), next=index + 1, got=resumed,
        lost=lost, s="" if lost == 1 else "s"), step=got)


def judge_state(reference: RunRecord, runs: Sequence[RunRecord], labels: Sequence[str],
                elastic: bool = False, consequences: bool = True) -> Finding | None:
    """``STATE_DIVERGED`` at the earliest compared step of a resumed run, on any rank, whose state differs
    from the reference's: the restored step (when the run reported its state right after restoring) and
    every later step, each rank against the same rank of the reference (``elastic``: every rank against
    rank 0, without the captured generators, for a state that does not depend on the world size).
    ``consequences``: False leaves out the later steps from which other components differ (where the inputs
    differ from there on, the input findings that follow say what happened)."""
    expected_by_rank = reference.states_by_rank
    if not expected_by_rank:
        return None
    for index, rec in enumerate(runs[1:]):
        resumed = rec.resumed_step or 0
        first: tuple[int, int, dict[str, str], list[str], dict[str, int]] | None = None
        for rank, states in rec.states_by_rank.items():
            expected = expected_by_rank.get(0 if elastic else rank)
            if not expected:
                continue
            found = _first_divergence(expected, states, resumed, elastic, _partial_steps(rec, resumed))
            if found is not None and (first is None or _earlier(found[0], found[1], first[0], first[2])):
                first = (found[0], rank, *found[1:])
        if first is not None:
            step, rank, differ, agree, later = first
            if step == resumed:
                when = "the restored step of"
            elif step == resumed + 1:
                when = "first step after"
            else:
                when = f"{step - resumed} steps after"
            label = labels[index] if index < len(labels) else "the resume"
            where = f"step {step}" + (f" on rank {rank}" if _ranks(rec) > 1 else "")
            return Finding(STATE_DIVERGED, MSG_STATE_DIVERGED.format(
                step=where, when=when, label=label, what=describe(differ, agree, later if consequences else {})),
                step=step, components=tuple(differ))
    return None


def judge_digest_kinds(reference: RunRecord, runs: Sequence[RunRecord]) -> Finding | None:
    """``PROTOCOL`` when a resumed run's state leaves were digested with another kind of digest than the
    reference's (a program digesting its own leaves with an interpreter that lacks ``xxhash``, say): such
    digests differ whatever the state, so they must not read as ``STATE_DIVERGED``."""
    want = _digest_kinds(reference)
    for index, rec in enumerate(runs[1:], start=2):
        got = _digest_kinds(rec)
        if want and got and got != want:
            return Finding(PROTOCOL, MSG_DIGEST_KINDS.format(run=index, got=" and ".join(sorted(got)),
                                                             want=" and ".join(sorted(want))))
    return None


def _digest_kinds(rec: RunRecord) -> set[str]:
    states = [s for by_step in rec.states_by_rank.values() for s in by_step.values()] + list(rec.finals.values())
    return {digest_kind(d) for s in states for leaves in s.leaves.values() for d in leaves.values()}


def judge_final(reference: RunRecord, runs: Sequence[RunRecord], labels: Sequence[str]) -> Finding | None:
    """``STATE_DIVERGED`` when what the interrupted job delivered at the end (``run.final``) differs from
    what the uninterrupted run delivered, on any rank (None when the reference reports no final outputs)."""
    expected = reference.finals
    if not expected or len(runs) < 2:
        return None
    last = runs[-1]
    label = labels[-1] if labels else "the resume"
    finals = last.finals
    for rank, want in expected.items():
        got = finals.get(rank, StepState())
        differ = differences(want, got)
        if differ:
            agree = [c for c in _names(want, got) if c not in differ]
            where = f" on rank {rank}" if len(expected) > 1 else ""
            missing = {name: got.missing[name] for name in differ if name in got.missing}
            what = describe({k: v for k, v in differ.items() if k not in missing}, agree, {}, missing)
            return Finding(STATE_DIVERGED, MSG_FINAL_DIVERGED.format(where=where, label=label, what=what),
                           step=last.last_step or None)
    return None


def judge_reference_state(first: RunRecord, second: RunRecord) -> Finding | None:
    """``NONDETERMINISTIC`` at the first step where the two reference runs' states differ, on any rank (a
    captured generator only if the run draws from it), or where their final outputs do."""
    a_by_rank, b_by_rank = first.states_by_rank, second.states_by_rank
    found: tuple[int, int, dict[str, str], list[str]] | None = None
    for rank, a in a_by_rank.items():
        b = b_by_rank.get(rank, {})
        digests = _digests(a)
        for step in sorted(set(a) & set(b)):
            diff = {name: key for name, key in differences(a[step], b[step]).items()
                    if name not in CAPTURED or drawn_after(digests, name, 0)}
            if diff:
                if found is None or step < found[0]:
                    agree = [c for c in _names(a[step], b[step]) if c not in diff and c not in CAPTURED]
                    found = (step, rank, diff, agree)
                break
    if found is not None:
        step, rank, diff, agree = found
        where = f"{step}" + (f" on rank {rank}" if len(a_by_rank) > 1 else "")
        return Finding(NONDETERMINISTIC, MSG_STATE_NONDETERMINISTIC.format(
            step=where, what=describe(diff, agree, {})), step=step)
    for rank, want in first.finals.items():
        diff = differences(want, second.finals.get(rank, StepState()))
        if diff:
            agree = [c for c in _names(want, want) if c not in diff]
            return Finding(NONDETERMINISTIC, MSG_FINAL_NONDETERMINISTIC.format(what=describe(diff, agree, {})))
    return None


def _earlier(step: int, differ: Mapping[str, str], than_step: int, than_differ: Mapping[str, str]) -> bool:
    """Whether a rank's first divergence (``step``, ``differ``) names the cause better than another rank's:
    it comes at an earlier step, or at the same step a generator differs there and not on the other rank (a
    generator is an input of the step; a model or optimizer that differs on every rank after an all-reduce
    is the consequence of the rank whose generator was not restored). Otherwise the lower rank stays."""
    if step != than_step:
        return step < than_step
    return _generator_differs(differ) and not _generator_differs(than_differ)


def _generator_differs(differ: Mapping[str, str]) -> bool:
    return any(name in CAPTURED for name in differ)


def _partial_steps(rec: RunRecord, resumed: int) -> set[int]:
    """Steps where a run may have reported only part of its state: the restored step (what the resume
    code reports), and the step a killed run was killed in (the kill may come before the trainer's call)."""
    return {resumed, rec.last_step} if rec.outcome == Outcome.KILLED else {resumed}


def _first_divergence(expected: Mapping[int, StepState], states: Mapping[int, StepState], resumed: int,
                      elastic: bool, partial: set[int]) -> tuple[int, dict[str, str], list[str], dict[str, int]] | None:
    """The earliest step from ``resumed`` on whose compared components differ: (step, differing
    components with their first differing key, agreeing ones, later steps from which the agreeing ones
    differ too). At a ``partial`` step only the components the run reported there are compared. A captured
    generator is compared only if the reference still draws from it after the restored step: at the
    restored step as the next step took its first inputs (the state the resume continues with), later at
    each step's end. At the restored step a reported copy of a process-global generator is judged as that
    generator (:func:`_generator_copied`)."""
    digests = _digests(expected)
    first: tuple[int, dict[str, str], list[str]] | None = None
    later: dict[str, int] = {}
    for step in sorted(s for s in states if s >= resumed and s in expected):
        want, got = expected[step], states[step]
        diff = differences(want, got)
        # Reported copies of a generator at the restored step, judged as that generator: name -> generator.
        copies: dict[str, str] = {}
        for name in list(diff):
            captured = name in CAPTURED
            if step == resumed and not captured:
                copied = _generator_copied(want, got, name)
                if copied is not None:
                    copies[name] = copied
            if (captured and (elastic or step == resumed or not drawn_after(digests, name, resumed))) or (
                    step in partial and not _reported(got, name)) or name in copies:
                del diff[name]
        diff = {name: "" if name in CAPTURED else key for name, key in diff.items()}  # a generator has no key to name
        if step == resumed and not elastic:
            for generator, when in _before_next_differences(want, got, step, digests).items():
                # Named as the trainer reported it, where it did: the copy it restored (or did not).
                copy = next((name for name, copied in copies.items() if copied == generator), None)
                diff[copy or generator] = when
        if first is None and diff:
            names = [c for c in _names(want, got) if (c not in CAPTURED or c in diff) and c not in copies]
            first = (step, diff, [c for c in names if c not in diff and (step not in partial or _reported(got, c))])
        elif first is not None:
            for component in diff:
                if component not in first[1]:
                    later.setdefault(component, step)
    return None if first is None else (*first, later)


def _before_next_differences(want: StepState, got: StepState, step: int,
                             digests: Mapping[int, Mapping[str, str]]) -> dict[str, str]:
    """The captured generators a resume of ``step`` continued with that differ from the reference's as its
    step ``step + 1`` took its first inputs (only those the reference draws from after ``step``)."""
    return {name: f"as step {step + 1} took its first inputs" for name, digest in sorted(got.before_next.items())
            if name in want.before_next and want.before_next[name] != digest and drawn_after(digests, name, step)}


def _generator_copied(want: StepState, got: StepState, name: str) -> str | None:
    """The process-global generator that component ``name`` copies, when every leaf of it that differs at the
    restored step is, in the reference, that generator's state as the harness captured it there
    (``"rng": torch.get_rng_state()``); else None. Such a copy is judged as the generator is: by what the
    resumed run continues with. A trainer that restores torch's generator only after a mid-epoch resume
    started its loader's iterator (which draws from it) reports it before that restore; its copy differs at
    the restored step and agrees from the next step on."""
    ours, theirs = got.leaves.get(name, {}), want.leaves.get(name, {})
    if not ours or not theirs:
        return None
    bodies = {digest: captured for captured, body in GENERATOR_BODY.items()
              for key, digest in want.leaves.get(captured, {}).items() if body is None or key in body}
    copied = {bodies.get(theirs.get(key, "")) for key in {*ours, *theirs} if ours.get(key) != theirs.get(key)}
    return copied.pop() if len(copied) == 1 and None not in copied else None


def _reported(state: StepState, name: str) -> bool:
    return name in state.digests or name in state.compared


def _digests(states: Mapping[int, StepState]) -> dict[int, dict[str, str]]:
    return {step: state.digests for step, state in states.items()}


def _ranks(rec: RunRecord) -> int:
    return len(rec.states_by_rank)


def differences(expected: StepState, actual: StepState) -> dict[str, str]:
    """Components of ``actual`` that differ from ``expected``, each with its first differing key
    (``""`` when the component is one opaque digest). Under a tolerance the child compared the values;
    the captured generators are digests in either mode."""
    out = {name: key for name, key in actual.compared.items() if key is not None}
    for name in _names(expected, actual):
        if name in actual.compared or name in out:
            continue
        if name not in actual.digests or name not in expected.digests:
            if not (actual.compared and name in expected.compared):
                out[name] = NOT_REPORTED
        elif actual.digests[name] != expected.digests[name]:
            out[name] = first_differing_key(actual.leaves.get(name, {}), expected.leaves.get(name, {})) or ""
    return out


#: How many components a headline names in each of its lists (those that differ, agree, differ later);
#: past it the rest is counted (``... and 31 more agree``): a trainer reported through ``state_of`` has
#: dozens, and the headline is one line.
HEADLINE_NAMES = 8


def describe(differ: Mapping[str, str], agree: Sequence[str], later: Mapping[str, int],
             missing: Mapping[str, str] | None = None) -> str:
    """``optimizer differs (state.0.exp_avg), model and rng agree; model differs from step 6``: the
    components that differ first (the cause), then, as consequences, the steps from which others differ.
    A generator the harness captured says so; a final output the run did not deliver (``missing``, with
    where it was expected) says that. Each list names at most :data:`HEADLINE_NAMES` components and counts
    the rest."""
    parts = [MSG_OUTPUT_MISSING.format(name=name, where=where) for name, where in (missing or {}).items()]
    parts += [_differs(name, key) for name, key in differ.items()]
    if len(parts) > HEADLINE_NAMES:
        parts = [*parts[:HEADLINE_NAMES - 1], f"{len(parts) - HEADLINE_NAMES + 1} more differ"]
    text = ", ".join(parts)
    if agree:
        if len(agree) > HEADLINE_NAMES:
            named = [*agree[:HEADLINE_NAMES - 1], f"{len(agree) - HEADLINE_NAMES + 1} more"]
            text += f", {_and(named)} agree"
        else:
            text += f", {_and(agree)} agree{'s' if len(agree) == 1 else ''}"
    if later:
        steps = [f"{_name(name)} differs from step {step}" for name, step in later.items()]
        if len(steps) > HEADLINE_NAMES:
            steps = [*steps[:HEADLINE_NAMES - 1], f"{len(steps) - HEADLINE_NAMES + 1} more differ later"]
        text += "; " + ", ".join(steps)
    return text


def _differs(name: str, key: str) -> str:
    if name in CAPTURED:
        return f"{name} differs (captured by the harness{', ' + key if key else ''})"
    return f"{name} differs ({key})" if key else f"{name} differs"


def _name(name: str) -> str:
    return f"{name} (captured by the harness)" if name in CAPTURED else name


def _names(a: StepState, b: StepState) -> list[str]:
    names = [*a.digests, *(n for n in a.compared if n not in a.digests)]
    names += [n for n in (*b.digests, *b.compared) if n not in names]
    return names


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
