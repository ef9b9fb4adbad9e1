"""Judge what a resumed run restored: the checkpoint it chose and the training state it continued with.

*Which checkpoint.* The harness saw every checkpoint the runs before a resume published. A resumed
run must restore the last one (in ``auto`` mode the newest in its directory, in ``path`` mode the one
it was given): a fresh start or an older checkpoint is ``STALE_RESUME``, with the steps of training
lost; a step beyond any step the runs before it reached is ``PROTOCOL``. In a crash cell the first resume is judged
by the crash-consistency rule instead (the newest checkpoint whose save completed before the fault).

*Which state.* After each resume, the state the run reports (``run.state``) is compared step by step
with the reference's at the same step; the first difference is ``STATE_DIVERGED``, naming the
components that differ (with their first differing key), those that agree, and the later steps from
which the agreeing ones differ too. The two reference runs are compared the same way: a difference
there is ``NONDETERMINISTIC``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pytest_resume_check.categories import NONDETERMINISTIC, PROTOCOL, STALE_RESUME, STATE_DIVERGED
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RESUME_DISABLED, SIGNAL_TERM
from pytest_resume_check.records.results import Finding, RunRecord, StepState
from pytest_resume_check.records.state import first_differing_key

MSG_STALE = ("STALE_RESUME: run {run} resumed from {got} but {want} was the newest checkpoint whose save "
             "completed before the crash ({why}); the work saved since is trained again")
MSG_STALE_PUBLISHED = ("STALE_RESUME: run {run} {got} but {want} was published before the kill: {lost} step{s} "
                       "of training lost")
MSG_UNPUBLISHED = ("PROTOCOL: run {run} reported resuming from step {step}, but no run before it got past step "
                   "{reached}; report the step of the checkpoint actually loaded")
MSG_STATE_DIVERGED = "STATE_DIVERGED at step {step} ({when} {label}): {what}"
MSG_STATE_NONDETERMINISTIC = (
    "NONDETERMINISTIC reference: two uninterrupted runs differ in their state from step {step}: {what}; seed "
    "every random source from run.seed (torch, numpy, random, loader workers), or declare "
    "state_tolerance=(rtol, atol) on the target if its kernels are not bitwise deterministic")

MSG_RANKS_DISAGREE = ("STALE_RESUME: rank {rank} of run {run} resumed from {got} but rank 0 resumed from {want}: "
                      "the ranks of one job continue from different checkpoints")
MSG_PREEMPTED = ("STALE_RESUME: run {run} got SIGTERM at the end of step {step} and {what} within its {grace:g} s "
                 "grace period; run {next} {got}: {lost} step{s} of training lost. A trainer that saves on SIGTERM "
                 "must publish that checkpoint before the grace period ends")

#: Shown as the key of a component one side did not report at that step.
NOT_REPORTED = "not reported"


def checkpoint_name(step: int, path: str | None) -> str:
    """``global_step_4`` (the folder's name) or ``the checkpoint of step 4``."""
    return os.path.basename(os.path.normpath(path)) if path else f"the checkpoint of step {step}"


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
            what = (f"resumed from {checkpoint_name(got, rec.resumed_path)} (step {got})" if got
                    else "started fresh (resumed step 0)")
            lost = want_step - got
            return [Finding(STALE_RESUME, MSG_STALE_PUBLISHED.format(
                run=index + 1, got=what, want=checkpoint_name(want_step, want_path), lost=lost,
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
                rank=rank, run=index + 1, got=f"{checkpoint_name(step, path)} (step {step})",
                want=f"{checkpoint_name(*lead)} (step {lead[0]})"), step=min(step, lead[0]))
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
    resumed = (f"resumed from {checkpoint_name(got, rec.resumed_path)} (step {got})" if got
               else "started fresh (resumed step 0)")
    lost = max(step - got, 0)
    return Finding(STALE_RESUME, MSG_PREEMPTED.format(
        run=index, step=step, what=what, grace=float(signalled.extra.get("grace", 0)), next=index + 1, got=resumed,
        lost=lost, s="" if lost == 1 else "s"), step=got)


def judge_state(reference: RunRecord, runs: Sequence[RunRecord], labels: Sequence[str]) -> Finding | None:
    """``STATE_DIVERGED`` at the first step after a resume whose state differs from the reference's."""
    expected = reference.states
    if not expected:
        return None
    for index, rec in enumerate(runs[1:]):
        resumed = rec.resumed_step or 0
        states = rec.states
        steps = sorted(s for s in states if s > resumed and s in expected)
        first: int | None = None
        differ: dict[str, str] = {}
        agree: list[str] = []
        later: dict[str, int] = {}
        for step in steps:
            diff = differences(expected[step], states[step])
            if first is None and diff:
                first, differ = step, diff
                agree = [c for c in _names(expected[step], states[step]) if c not in diff]
            elif first is not None:
                for component in diff:
                    if component not in differ:
                        later.setdefault(component, step)
        if first is not None:
            when = "first step after" if first == resumed + 1 else f"{first - resumed} steps after"
            label = labels[index] if index < len(labels) else "the resume"
            return Finding(STATE_DIVERGED, MSG_STATE_DIVERGED.format(
                step=first, when=when, label=label, what=describe(differ, agree, later)), step=first)
    return None


def judge_reference_state(first: RunRecord, second: RunRecord) -> Finding | None:
    """``NONDETERMINISTIC`` at the first step where the two reference runs' states differ."""
    a, b = first.states, second.states
    for step in sorted(set(a) & set(b)):
        diff = differences(a[step], b[step])
        if diff:
            agree = [c for c in _names(a[step], b[step]) if c not in diff]
            return Finding(NONDETERMINISTIC, MSG_STATE_NONDETERMINISTIC.format(
                step=step, what=describe(diff, agree, {})), step=step)
    return None


def differences(expected: StepState, actual: StepState) -> dict[str, str]:
    """Components of ``actual`` that differ from ``expected``, each with its first differing key
    (``""`` when the component is one opaque digest)."""
    if actual.compared:  # tolerance mode: the child compared the values with the reference's
        return {name: key for name, key in actual.compared.items() if key is not None}
    out = {}
    for name in _names(expected, actual):
        if name not in actual.digests or name not in expected.digests:
            out[name] = NOT_REPORTED
        elif actual.digests[name] != expected.digests[name]:
            out[name] = first_differing_key(actual.leaves.get(name, {}), expected.leaves.get(name, {})) or ""
    return out


def describe(differ: Mapping[str, str], agree: Sequence[str], later: Mapping[str, int]) -> str:
    """``optimizer differs (state.0.exp_avg), model and rng agree; model differs from step 6``."""
    parts = [f"{name} differs ({key})" if key else f"{name} differs" for name, key in differ.items()]
    text = ", ".join(parts)
    if agree:
        text += f", {_and(agree)} agree{'s' if len(agree) == 1 else ''}"
    if later:
        text += "; " + ", ".join(f"{name} differs from step {step}" for name, step in later.items())
    return text


def _names(a: StepState, b: StepState) -> list[str]:
    names = list(a.digests or a.compared)
    names += [n for n in (b.digests or b.compared) if n not in names]
    return names


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
