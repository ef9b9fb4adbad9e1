"""Judge an interrupted run against the uninterrupted reference.

:func:`judge` takes its :data:`STEPS` in this order (docs/reading-a-report.md: process problems first,
with them the ledgers mean nothing, then the ledgers under the target's contract). Every finding of the
steps marked *final* ends the judging; the other steps add theirs and go on.

1. report calls (final): a run reported out of order (``PROTOCOL``);
2. silent I/O error (final): an I/O error injected into a save did not fail the run (``SILENT_IO_ERROR``);
3. ranks (final): the ranks of a resumed run restored different checkpoints (``STALE_RESUME``); the
   process problem of step 4, if any, follows it as its consequence;
4. processes (final): the first run that did not end as planned: it raised while resuming
   (``RESUME_ERROR``), died (``CRASHED``) or hung (``HUNG``);
5. killed last run (final): no run finished the training (``PROTOCOL``);
6. restored checkpoint: a resume restored an older checkpoint than it was entitled to (``STALE_RESUME``),
   or a step no run reached (``PROTOCOL``, final);
7. ledgers: each ledger the contract names, composed over the runs, against the reference's: inputs
   missing (``LOST``), taken more often (``DUPLICATED``), the same inputs with other epoch labels
   (``EPOCH``) and, for ordered contracts, in another order (``REORDERED``); a resumed run that never
   said where it resumed is ``PROTOCOL`` (final);
8. state: the training state after a resume differs from the reference's at the restored step or a
   later one, on any rank, or the job's final outputs differ (``STATE_DIVERGED``), unless only after the
   step the resume whose inputs differ restored (their consequence); at that restored step itself it is
   their cause and comes first (after a resume at another world size only with ``elastic_state``).

The first finding's headline names what the kill came after when that is the cause: a lost node, or a
zero-change program's commit that named a checkpoint before it was complete (:data:`MSG_COMMITTED_EARLY`).

:func:`judge_reference` judges the reference runs themselves, :func:`entry_marks` marks each ledger
entry as :func:`compare` matches it, and :func:`first_difference` finds where two ledgers part.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_resume_check.categories import (  # noqa: F401  (re-exported: tests and users import them here)
    CRASHED,
    DUPLICATED,
    EPOCH,
    HARNESS,
    HUNG,
    LOST,
    NONDETERMINISTIC,
    PROTOCOL,
    REORDERED,
    RESUME_ERROR,
    SILENT_IO_ERROR,
    STALE_RESUME,
    STATE_DIVERGED,
    TARGET_ERROR,
    VERDICT_CATEGORIES,
)
from pytest_resume_check.judge.state_verdict import (  # noqa: F401  (MSG_* re-exported for tests)
    MSG_STALE,
    MSG_STALE_PUBLISHED,
    MSG_STATE_DIVERGED,
    MSG_STATE_NONDETERMINISTIC,
    MSG_UNPUBLISHED,
    checkpoint_name,
    judge_digest_kinds,
    judge_final,
    judge_ranks_agree,
    judge_reference_state,
    judge_restored,
    judge_state,
    step_unit,
)
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import INJECTED, MODE_ERROR
from pytest_resume_check.records.ledger import Entry, Ledger, ResumeReportMissing, compose
from pytest_resume_check.records.names import ISOLATION_FORKSERVER, OPT_ISOLATION
from pytest_resume_check.records.results import (
    AS_PLANNED,
    FINISHED,
    Finding,
    Outcome,
    RunRecord,
    StepState,
    Verdict,
)
from pytest_resume_check.records.state import CAPTURED

if TYPE_CHECKING:
    from pytest_resume_check.records.faults import FaultPlan
    from pytest_resume_check.targets import Contract

#: Headline templates; tests import these rather than repeating the words.
MSG_LOST = "LOST {n} input{s} after {where}: ids {ids} ({epochs})"
MSG_DUPLICATED = "DUPLICATED {n} input{s} after {where}: ids {ids} ({epochs})"
#: A LOST or DUPLICATED headline's part for each further resume whose run took (or lost) inputs, after
#: ``; `` (a double kill: ``DUPLICATED 2 inputs after A: ids 4, 5 (epoch 0); 1 input after B: ids 9 (epoch 0)``).
MSG_MORE_AFTER = "{n} input{s} after {where}: ids {ids} ({epochs})"
MSG_EPOCH = "EPOCH labels differ for {n} input{s} after {where}: ids {ids} ({detail})"
MSG_REORDERED = "REORDERED: same inputs, other order after {where}, from position {pos}: {detail}"
MSG_RESUME_ERROR = "RESUME_ERROR: run {run} raised while resuming: {error}"
MSG_CRASHED = "CRASHED: {who} {what}"
MSG_HUNG = "HUNG: {who} sent no event for {timeout} s after step {step}; it was killed"
MSG_HUNG_AT_START = ("HUNG: {who} sent no event at all within {timeout} s of being forked from the preloaded "
                     "server; the trainer may not be fork-safe (threads or locks held at fork time): declare "
                     "the target with isolation='spawn' or run with " + OPT_ISOLATION + "=spawn")
MSG_HUNG_COMMAND_AT_START = ("HUNG: {who} sent no event at all within {timeout} s: the program ({argv}) never "
                             "reported; it must call client.connect() and report (resumed, consumed, step_end) "
                             "as it trains, or it waits for something that never comes (see its log)")
MSG_HUNG_STALLED = "HUNG: {who}: {what}; it was killed"
#: Ends a HUNG headline whose run wrote its stacks into its log before it was killed (the log is kept with the
#: failing cell): every rank wrote them, only some ranks did (``rank 1``, ``ranks 0, 2``: the others had ended
#: or had no handler), or the one process did.
MSG_HUNG_STACKS = "; every rank's stack is in {path}"
MSG_HUNG_STACKS_OF = "; the stacks of {ranks} are in {path}"
MSG_HUNG_STACK = "; its stack is in {path}"
MSG_NONDETERMINISTIC = "NONDETERMINISTIC reference: two uninterrupted runs differ from position {pos}: {detail}"
MSG_PROTOCOL = "PROTOCOL: {detail}"
MSG_EMPTY = ("PROTOCOL: the reference run reported no {kind} inputs; the target must call "
             "run.{kind}(ids, step=..., epoch=...) for what it takes (or drop '{kind}' from its contract)")
MSG_SILENT_IO = ("SILENT_IO_ERROR: an injected {error} at file operation {op} of the save of step {step} did not "
                 "fail the run ({what}); the checkpoint may be incomplete and nobody knows")
MSG_STEPS = "PROTOCOL: the target declares {declared} steps for this case but its reference run took {actual}"
MSG_CHECKPOINTS = ("PROTOCOL: the target declares steps={declared}, the checkpoints an uninterrupted run publishes, "
                   "but its reference run published {actual} matching {glob!r} in {{checkpoint_dir}}; give the number "
                   "it publishes, or the glob of its checkpoint files' final names")
#: MSG_CHECKPOINTS of a program that commits its checkpoints through a pointer or tracker file.
MSG_COMMITS = ("PROTOCOL: the target declares steps={declared}, the checkpoints an uninterrupted run publishes, "
               "but its reference run committed {actual} through {commit!r} in {{checkpoint_dir}}; give the number "
               "it commits, or the glob of the file that names each complete checkpoint")
#: Follows MSG_CHECKPOINTS (and the record of a save) when the program filled checkpoint folders in place.
FIX_FILLED_IN_PLACE = ("it fills {folder} in place, and a folder filled in place never gets a final name that "
                       "publishes it: write each checkpoint into a temporary folder (or under a temporary name) and "
                       "rename it into place once complete, or declare commit= with the file the program writes once "
                       "a checkpoint is complete (docs/recipes/command.md)")
#: A declared output the uninterrupted run did not deliver: nothing to compare the interrupted job's with.
MSG_OUTPUT_NOT_DELIVERED = ("PROTOCOL: the reference run delivered nothing matching outputs={output!r} (expected at "
                            "{where}); give the glob of a file the program writes into {{checkpoint_dir}}")
#: The cause put in front of the first finding of a cell whose kill came after a commit that named a
#: checkpoint before it was complete.
MSG_COMMITTED_EARLY = ("{file} named {checkpoint} before it was complete, and the kill came between the two (the "
                       "program commits a checkpoint before it has written it)")
MSG_CALLS = "PROTOCOL: {who} {what}"
#: Appended to a failing run's headline when its error is a full disk.
DISK_FULL = "; the disk is full (No space left on device): free space there or point --basetemp at a bigger disk"
DISK_FULL_MARKERS = ("No space left on device", "ENOSPC", "[Errno 28]")

MAX_IDS = 10
#: Categories found by comparing ledgers.
LEDGER_CATEGORIES = frozenset({LOST, DUPLICATED, EPOCH, REORDERED})


def resume_label(step: int | None, path: str | None, unit: str = "step") -> str:
    """``resume from global_step_3`` / ``restart from scratch`` (step 0: the run reported a fresh start).
    ``unit``: what a step of the target is (``ckpt_4.pt (checkpoint 2)`` for a zero-change program, whose
    steps are the checkpoints it publishes; :func:`step_unit`)."""
    if not step:
        return "restart from scratch"
    return f"resume from {checkpoint_name(step, path, unit)}" if path else f"resume from {unit} {step}"


#: The story's label of a resumed run that ended before it reported what it restored (``run.resumed``): it
#: is no restart from scratch, it was still loading (``run 2 (restart from scratch): raised
#: EOFError`` of a run that died reading ``step_6.pt``).
LABEL_UNREPORTED = "{how} before reporting what it resumed"
#: ``how`` of :data:`LABEL_UNREPORTED`, by the run's outcome.
UNREPORTED_HOW = {Outcome.RAISED: "raised", Outcome.CRASHED: "died", Outcome.HUNG: "hung", Outcome.KILLED: "killed"}
#: The label of a resumed run that finished without ever reporting what it restored (a ``PROTOCOL`` cell).
LABEL_NEVER_REPORTED = "never reported what it resumed"


def run_label(rec: RunRecord) -> str:
    """How the story of a cell names a resumed run: what it reported restoring (:func:`resume_label`) or,
    when it never reported that, how it ended before it did (:data:`LABEL_UNREPORTED`)."""
    if rec.resumed_step is not None:
        return resume_label(rec.resumed_step, rec.resumed_path, step_unit(rec))
    how = UNREPORTED_HOW.get(rec.outcome)
    return LABEL_UNREPORTED.format(how=how) if how else LABEL_NEVER_REPORTED


def judge_reference(first: RunRecord, second: RunRecord | None, declared_steps: int | None,
                    contract: Contract) -> list[Finding]:
    """Problems of the reference itself: it must finish, take the declared steps, and repeat."""
    calls = _call_finding([first, second], lambda i: "the reference run")
    if calls is not None:
        return [calls]
    for rec in (first, second):
        if rec is not None and rec.outcome != Outcome.DONE:
            return [_process_finding(rec, "the reference run", resumed=False)]
    for kind in contract.ledgers:
        if not Ledger.from_events(first.events, kind):
            return [Finding(PROTOCOL, MSG_EMPTY.format(kind=kind))]
    if declared_steps is not None and first.last_step != declared_steps:
        command = first.plan.command
        if command is not None and command.checkpoints is not None:
            return [_checkpoints_finding(first, declared_steps, command.checkpoints)]
        return [Finding(PROTOCOL, MSG_STEPS.format(declared=declared_steps, actual=first.last_step))]
    missing = first.finals.get(0, StepState()).missing
    if missing:  # nothing to compare an interrupted job's output with
        output, where = next(iter(missing.items()))
        return [Finding(PROTOCOL, MSG_OUTPUT_NOT_DELIVERED.format(output=output, where=where))]
    if second is not None:
        for kind in contract.ledgers:
            a = Ledger.from_events(first.events, kind)
            b = Ledger.from_events(second.events, kind)
            if _keys(a) != _keys(b):
                pos = _first_difference(_keys(a), _keys(b))
                return [Finding(NONDETERMINISTIC, MSG_NONDETERMINISTIC.format(
                    pos=pos, detail=_pair_detail(a, b, pos)), kind, position=pos)]
        state = judge_reference_state(first, second)
        if state is not None:
            return [state]
    return []


def _checkpoints_finding(first: RunRecord, declared: int, glob: str) -> Finding:
    """A zero-change reference that published another number of checkpoints than declared, with the fix for a
    program that fills its checkpoint folders in place."""
    if first.plan.commit is not None:
        text = MSG_COMMITS.format(declared=declared, actual=first.last_step, commit=first.plan.commit)
    else:
        text = MSG_CHECKPOINTS.format(declared=declared, actual=first.last_step, glob=glob)
    filled = [e.path for e in first.events if e.kind == ev.IN_PLACE and e.path]
    if filled and not first.published:
        text += "; " + FIX_FILLED_IN_PLACE.format(folder=os.path.basename(filled[0]))
    return Finding(PROTOCOL, text)


def judge(reference: RunRecord, runs: Sequence[RunRecord], contract: Contract,
          newest_complete: int | None = None) -> Verdict:
    """Judge the interrupted ``runs`` (first, then each resumed one) against ``reference``: the
    :data:`STEPS` in order, until one says the judging ends.

    ``newest_complete``: for a fault in a save, the newest checkpoint that was complete at the fault;
    the first resumed run must not start from anything older (STALE_RESUME).
    """
    judging = _Judging(reference, runs, contract, newest_complete)
    for step in STEPS:
        if step(judging):
            break
    findings = judging.verdict.findings
    lost = _lost_node(runs) + (_crashed_rank(runs, findings[0].headline) if findings else "")
    if findings and lost:  # the headline names the node whose loss, or the rank whose crash, the failure follows
        findings[0] = replace(findings[0], headline=findings[0].headline + lost)
    cause = _committed_early(runs)
    if findings and cause:  # the headline starts with the cause of what the resume did
        findings[0] = replace(findings[0], headline=_with_cause(findings[0], cause))
    return judging.verdict


def _committed_early(runs: Sequence[RunRecord]) -> str:
    """:data:`MSG_COMMITTED_EARLY` for the first run killed right after a commit (a kill at its checkpoint, or
    after the last file operation of its save) that named a checkpoint that was not complete yet, or ''."""
    for rec in runs[:-1]:
        kill = rec.plan.kill
        if rec.outcome != Outcome.KILLED or kill is None or kill.extra_steps:
            continue
        if kill.fault is not None and not kill.fault.completes_save:
            continue  # killed inside a later save: the checkpoint that commit named may be complete by now
        commits = [e for e in rec.events if e.kind == ev.COMMIT and e.step == kill.checkpoint_step]
        if commits and not commits[-1].extra.get(ev.EXTRA_COMPLETE, True):
            last = commits[-1]
            named = os.path.basename(last.path) if last.path else "no checkpoint"
            return MSG_COMMITTED_EARLY.format(file=last.extra.get(ev.EXTRA_FILE), checkpoint=named)
    return ""


def _with_cause(finding: Finding, cause: str) -> str:
    """``CATEGORY: cause; rest of the headline`` (``cause`` appended to a headline of another shape)."""
    prefix = f"{finding.category}: "
    if finding.headline.startswith(prefix):
        return f"{prefix}{cause}; {finding.headline[len(prefix):]}"
    return f"{finding.headline}; {cause}"


#: Appended to the headline of a cell whose run lost a simulated node (``:node1``).
MSG_NODE_LOST = "; node {node} was lost at step {step} and torchrun went on with {world} rank{s}"
#: Appended after it when the node came back (``:node1:rejoin8``).
MSG_NODE_BACK = ", until it rejoined after checkpoint {step} ({world} ranks again)"


def _lost_node(runs: Sequence[RunRecord]) -> str:
    """:data:`MSG_NODE_LOST` for the first run that lost a node (the world of the restart after it), or ''."""
    for before, after in zip(runs, runs[1:]):
        kill = before.plan.kill
        if kill is not None and kill.node is not None and before.outcome == Outcome.KILLED:
            world = after.plan.world_size
            text = MSG_NODE_LOST.format(node=kill.node, step=kill.kill_step, world=world, s="" if world == 1 else "s")
            if kill.rejoin is not None:
                text += MSG_NODE_BACK.format(step=kill.rejoin, world=runs[-1].plan.world_size)
            return text
    return ""


#: Appended to the headline of a crash cell of a save of several ranks: where each rank and thread was stopped
#: (the killed one first) and what the damage after the kill did. (Not which rank of the resume raised: when
#: several would, the first to raise ends the others, and which one that is depends on timing.)
MSG_RANK_CRASH = "; the crash: {where}"


def _crashed_rank(runs: Sequence[RunRecord], headline: str) -> str:
    """:data:`MSG_RANK_CRASH` for a run killed inside a save of several ranks, unless ``headline`` says it
    already, or ''."""
    for rec in runs[:-1]:
        fault = rec.plan.kill.fault if rec.plan.kill is not None else None
        if fault is None or fault.rank is None or rec.outcome != Outcome.KILLED:
            continue
        where = rec.describe()
        return "" if where in headline else MSG_RANK_CRASH.format(where=where)
    return ""


@dataclass
class _Judging:
    """What the steps of :func:`judge` read, and the verdict they add their findings to."""

    reference: RunRecord
    runs: Sequence[RunRecord]
    contract: Contract
    newest_complete: int | None
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def elastic(self) -> bool:
        """A resume at another world size: judged by the elastic contract, each epoch's inputs exactly once."""
        return any(r.plan.world_size != self.reference.plan.world_size for r in self.runs)

    @property
    def fault(self) -> FaultPlan | None:
        """The fault injected into the first run's save, if any."""
        return self.runs[0].plan.faults if self.runs else None

    def who(self, index: int) -> str:
        """How a headline names run ``index``: ``run 2 of 3``."""
        return f"run {index + 1} of {len(self.runs)}"

    def add(self, finding: Finding | None) -> bool:
        """Add ``finding`` to the verdict; True when there was one."""
        if finding is not None:
            self.verdict.findings.append(finding)
        return finding is not None


def _report_calls(judging: _Judging) -> bool:
    """``PROTOCOL``: a run reported out of order; the ledgers of such a run mean nothing (ends the judging)."""
    return judging.add(_call_finding(judging.runs, judging.who))


def _silent_io_error(judging: _Judging) -> bool:
    """``SILENT_IO_ERROR``: an I/O error injected into the first run's save did not make it raise (ends the
    judging)."""
    fault = judging.fault
    if fault is None or fault.mode != MODE_ERROR or judging.runs[0].outcome == Outcome.RAISED:
        return False
    return judging.add(Finding(SILENT_IO_ERROR, MSG_SILENT_IO.format(
        error=os.strerror(fault.errno or 5), op=fault.op, step=fault.step, what=judging.runs[0].describe())))


def _ranks(judging: _Judging) -> bool:
    """``STALE_RESUME``: the ranks of a resumed run restored different checkpoints. Judged before how the
    runs ended: ranks that continue from different steps usually fail in a collective soon after, and that
    failure follows as the consequence. Ends the judging: the ledgers of ranks at different steps say
    nothing more."""
    if not judging.add(judge_ranks_agree(judging.runs)):
        return False
    judging.add(_process_problem(judging))
    return True


def _processes(judging: _Judging) -> bool:
    """``RESUME_ERROR``, ``CRASHED`` or ``HUNG``: the first run that did not end as planned (ends the
    judging: with it the ledgers mean nothing)."""
    return judging.add(_process_problem(judging))


def _process_problem(judging: _Judging) -> Finding | None:
    """The finding of the first run that did not end as planned (None when all did)."""
    for index, rec in enumerate(judging.runs):
        if rec.outcome in AS_PLANNED:
            continue
        injected = rec.outcome == Outcome.RAISED and INJECTED in (rec.error or "")
        if index == 0 and judging.fault is not None and injected:
            continue  # the injected I/O error made the save fail loudly, as it must (any other error is the run's)
        return _process_finding(rec, judging.who(index), resumed=rec.plan.is_resume, run=index + 1)
    return None


def _killed_last_run(judging: _Judging) -> bool:
    """``PROTOCOL``: the last run was killed too, so no run finished the training (ends the judging)."""
    runs = judging.runs
    if not runs or runs[-1].outcome in FINISHED:
        return False
    return judging.add(Finding(PROTOCOL, MSG_PROTOCOL.format(detail="the last run was killed")))


def _restored_checkpoint(judging: _Judging) -> bool:
    """``STALE_RESUME``: a resume restored an older checkpoint than it was entitled to; ``PROTOCOL``: one
    reported a step no run reached, so the ledgers are cut at a step nobody trained and mean nothing (ends
    the judging)."""
    restored = judge_restored(judging.runs, judging.newest_complete)
    judging.verdict.findings.extend(restored)
    return any(f.category == PROTOCOL for f in restored)


def _ledgers(judging: _Judging) -> bool:
    """``LOST``, ``DUPLICATED``, ``EPOCH``, ``REORDERED``: each ledger the contract names against the
    reference's. ``PROTOCOL`` when a resumed run never reported where it resumed (ends the judging)."""
    if not judging.contract.ledgers:
        return _resumes(judging)
    for kind in judging.contract.ledgers:
        if _ledger(judging, kind):
            return True
    return False


def _resumes(judging: _Judging) -> bool:
    """A target that reports no inputs (a zero-change program): only that every resumed run reported what it
    restored, and the labels of its resumes (``PROTOCOL`` if one did not: ends the judging)."""
    runs = judging.runs
    try:
        _, resumed_from = compose([r.events for r in runs], "consumed")
    except ResumeReportMissing as exc:
        return judging.add(Finding(PROTOCOL, MSG_PROTOCOL.format(detail=exc)))
    judging.verdict.resumed_from = resumed_from
    judging.verdict.resume_labels = [resume_label(r.resumed_step, r.resumed_path, step_unit(r)) for r in runs[1:]]
    return False


def _ledger(judging: _Judging, kind: str) -> bool:
    """Compose the runs' ledger of ``kind``, keep it on the verdict (``ledgers``; ``reference`` and
    ``composite`` too for the contract's first kind), and add what :func:`compare` finds against the
    reference's, or else what one rank's own ledger shows."""
    runs, verdict = judging.runs, judging.verdict
    ref = Ledger.from_events(judging.reference.events, kind)
    try:
        comp, resumed_from = compose([r.events for r in runs], kind)
    except ResumeReportMissing as exc:
        return judging.add(Finding(PROTOCOL, MSG_PROTOCOL.format(detail=exc)))
    converged = runs[-1].converged_step if runs else None
    if converged is not None:
        # From here the resumed run's state equals the reference's: the reference's rest is its rest.
        tail = (Entry(e.id, e.step, e.epoch, len(runs), e.rank) for e in ref if e.step > converged)
        comp = Ledger(comp + Ledger(tail))
    verdict.resumed_from = resumed_from
    verdict.resume_labels = [resume_label(r.resumed_step, r.resumed_path, step_unit(r)) for r in runs[1:]]
    verdict.ledgers[kind] = (ref, comp)
    if kind == judging.contract.ledgers[0]:
        verdict.reference, verdict.composite = ref, comp
    ordered = judging.contract.ordered and not judging.elastic
    found = compare(ref, comp, ordered, kind, verdict.resume_labels, resumed_from)
    if not found and ref.ranks and not judging.elastic:
        # The global ledger agrees; each rank must also have taken its own inputs (ranks that swap
        # inputs pass a set comparison of the whole).
        found = _rank_findings(ref, comp, ordered, kind, verdict.resume_labels, resumed_from)
    verdict.findings.extend(found)
    return False


def _rank_findings(ref: Ledger, comp: Ledger, ordered: bool, kind: str, labels: Sequence[str],
                   resumed_from: Sequence[int]) -> list[Finding]:
    """The findings of the first rank whose own ledger differs from its reference's (empty if none does)."""
    for rank in ref.ranks:
        found = compare(ref.of_rank(rank), comp.of_rank(rank), ordered, kind, labels, resumed_from)
        if found:
            return [_on_rank(f, rank) for f in found]
    return []


def _state(judging: _Judging) -> bool:
    """``STATE_DIVERGED``: the training state after a resume differs from the reference's (the restored
    step included, every rank), or the job's final outputs do. At another world size only a target whose
    state does not depend on it is judged (``elastic_state``; other batches otherwise, so the state cannot
    equal the reference's). A state that differs only from where the inputs did is their consequence, not
    a second finding, and so are final outputs of a job whose inputs differ; but a state that differs at the
    step the resume whose inputs differ restored is their cause (a buffer dropped from the checkpoint shows
    in the restored state, then in the ledger): it comes first, and the ledger's findings say which inputs."""
    elastic = judging.elastic
    if elastic and not judging.reference.plan.elastic_state:
        return False
    labels = judging.verdict.resume_labels
    findings = judging.verdict.findings
    inputs_differ = [f.step for f in findings if f.category in LEDGER_CATEGORIES and f.step is not None]
    kinds = judge_digest_kinds(judging.reference, judging.runs)
    if kinds is not None:
        return judging.add(kinds)
    state = judge_state(judging.reference, judging.runs, labels, elastic=elastic)
    restored = _restored_before(judging, min(inputs_differ)) if inputs_differ else None
    if state is not None and restored is not None and state.step == restored and restored > 0:
        # The resume restored a state that already differs, and the inputs it takes differ too. Where the
        # trainer's own state differs (a buffer, a loader position left out of the checkpoint), that is the
        # cause: reported first, before the inputs it then takes or loses (which say what follows, so its
        # headline stops at the restored step). Where only a generator the harness captured as the next step
        # took its inputs differs, the data path may have moved it as well as followed from it: it comes
        # after the input findings, as what was seen, not named as their cause.
        restored_state = judge_state(judging.reference, judging.runs, labels, elastic=elastic,
                                     consequences=False) or state
        if any(name not in CAPTURED for name in state.components):
            findings.insert(0, restored_state)
        else:
            findings.append(restored_state)
        return False
    if state is not None and not (restored is not None and state.step is not None and state.step >= restored):
        return judging.add(state)
    if state is not None or inputs_differ or elastic:
        return False
    return judging.add(judge_final(judging.reference, judging.runs, labels))


def _restored_before(judging: _Judging, step: int) -> int:
    """The step the last resume before ``step`` restored (0 if none did): from there on, a state that
    differs belongs to the resume whose inputs differ, as their cause or their consequence."""
    restored = [r.resumed_step or 0 for r in judging.runs[1:]]
    return max((at for at in restored if at < step), default=0)


#: The steps of :func:`judge`, in order. Each adds its findings to the verdict and returns True when the
#: judging ends with them.
STEPS: tuple[Callable[[_Judging], bool], ...] = (
    _report_calls,
    _silent_io_error,
    _ranks,
    _processes,
    _killed_last_run,
    _restored_checkpoint,
    _ledgers,
    _state,
)


def compare(ref: Ledger, comp: Ledger, ordered: bool, kind: str = "consumed",
            labels: Sequence[str] = (), resumed_from: Sequence[int] = ()) -> list[Finding]:
    """Findings of one ledger against its reference (empty when they agree under the contract).

    Entries are matched by (id, epoch). What is left over is an epoch *label* difference only where the
    same id stands in the same place (step and position within it) with another epoch, and more of its
    epoch's leftovers do so than not. Everything else left over is LOST (reference entries) or
    DUPLICATED (composite entries beyond the reference's count: the later occurrences, so the resume
    named is the one that took them again). A resumed run that replays an epoch from another place
    reads as inputs taken twice and inputs never taken, not as a wrong epoch counter; one
    that trains on exactly the reference's inputs under another epoch number reads as EPOCH.
    """
    ref_keys, comp_keys = _keys(ref), _keys(comp)
    missing, extra, pairs = _leftovers(ref_keys, comp_keys, _slots(ref), _slots(comp))
    missing, extra, pairs = _by_chance(ref_keys, comp_keys, missing, extra, pairs)
    pos = _first_difference(ref_keys, comp_keys)
    findings = []
    lost = [ref[i] for i in missing]
    if lost:  # each entry blamed on the last resume before its step
        findings.append(_id_finding(LOST, MSG_LOST, _by_resume(
            lost, lambda e: _resume_of_step(e.step, labels, resumed_from), labels), kind, pos))
    duplicated = [comp[j] for j in extra]
    if duplicated:  # each entry blamed on the resume that started the run which took it again
        findings.append(_id_finding(DUPLICATED, MSG_DUPLICATED, _by_resume(
            duplicated, lambda e: _resume_of_run(e.run, labels), labels), kind, pos))
    if pairs:
        ids = list(dict.fromkeys(ref[i].id for i, _ in pairs))
        detail = ", ".join(f"{ref[i].id}: epoch {comp[j].epoch} instead of {ref[i].epoch}" for i, j in pairs[:3])
        findings.append(Finding(EPOCH, MSG_EPOCH.format(
            n=len(pairs), s=_s(len(pairs)), where=_where_run(comp[pairs[0][1]].run, labels),
            ids=_id_list(ids), detail=detail), kind, tuple(ids), pos, min(ref[i].step for i, _ in pairs)))
    if not findings and ordered and pos is not None:
        where = _where_run(comp[pos].run, labels) if pos < len(comp) else _where_run(len(labels), labels)
        findings.append(Finding(REORDERED, MSG_REORDERED.format(
            where=where, pos=pos, detail=_pair_detail(ref, comp, pos)), kind, position=pos,
            step=(ref[pos] if pos < len(ref) else comp[pos]).step))
    return findings


def _by_chance(ref_keys: Sequence[tuple[Any, Any]], comp_keys: Sequence[tuple[Any, Any]], missing: list[int],
               extra: list[int], pairs: list[tuple[int, int]]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Missing, extra and label pairs, with the pairs that are chance moved back to missing and extra.

    Pairs are grouped by (reference epoch, composite epoch). In a group where at least as many entries
    stayed unpaired as paired, the data itself differs (a shuffled replay puts an id back in its place now
    and then): all of it reads as LOST and DUPLICATED, not as a few wrong labels."""
    groups: dict[tuple[Any, Any], list[tuple[int, int]]] = {}
    for i, j in pairs:
        groups.setdefault((ref_keys[i][1], comp_keys[j][1]), []).append((i, j))
    chance = set()
    for (a, b), group in groups.items():
        unpaired = max(sum(1 for i in missing if ref_keys[i][1] == a), sum(1 for j in extra if comp_keys[j][1] == b))
        if unpaired >= len(group):
            chance.update(group)
    if not chance:
        return missing, extra, pairs
    return (sorted([*missing, *(i for i, _ in chance)]), sorted([*extra, *(j for _, j in chance)]),
            [p for p in pairs if p not in chance])


def _slots(ledger: Sequence[Any]) -> list[tuple[Any, int, int]]:
    """For each entry (an :class:`Entry` or a JSON row ``[id, step, epoch, run]``): its id, its step and
    its position among the entries of that step."""
    seen: Counter = Counter()
    out = []
    for entry in ledger:
        ident, step = (entry.id, entry.step) if isinstance(entry, Entry) else (_key(entry[0]), entry[1])
        out.append((ident, step, seen[step]))
        seen[step] += 1
    return out


def _leftovers(ref_keys: Sequence[tuple[Any, Any]], comp_keys: Sequence[tuple[Any, Any]],
               ref_slots: Sequence[tuple[Any, int, int]], comp_slots: Sequence[tuple[Any, int, int]],
               ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Indices of reference entries without a match, of composite entries beyond the reference's count,
    and the (reference, composite) index pairs among them that differ only in their epoch label."""
    ref_missing = [i for i, flag in enumerate(_beyond(ref_keys, Counter(comp_keys))) if flag]
    comp_extra = [j for j, flag in enumerate(_beyond(comp_keys, Counter(ref_keys))) if flag]
    free = {comp_slots[j]: j for j in comp_extra}
    pairs = []
    for i in ref_missing:
        j = free.get(ref_slots[i])
        if j is not None and comp_keys[j][1] != ref_keys[i][1]:
            pairs.append((i, j))
            del free[ref_slots[i]]
    paired_ref, paired_comp = {i for i, _ in pairs}, {j for _, j in pairs}
    return ([i for i in ref_missing if i not in paired_ref], [j for j in comp_extra if j not in paired_comp],
            pairs)


#: Marks of one ledger entry (:func:`entry_marks`): matched, or why not.
MARK_OK, MARK_LOST, MARK_DUPLICATED, MARK_REORDERED, MARK_EPOCH = ".", "L", "D", "R", "E"


def entry_marks(reference: Sequence[Sequence[Any]], composite: Sequence[Sequence[Any]]) -> tuple[str, str]:
    """Marks for each entry of both ledgers (rows ``[id, step, epoch, run]``), one character each.

    Entries are matched as :func:`compare` matches them: a reference entry without a match is ``LOST``;
    a composite entry beyond the reference's count is ``DUPLICATED``; an unmatched pair with the same id
    in the same place but another epoch is ``EPOCH``. When nothing is missing or extra, composite
    entries that stand where the reference has another input are ``REORDERED``.
    """
    ref_keys = [(_key(r[0]), r[2]) for r in reference]
    comp_keys = [(_key(r[0]), r[2]) for r in composite]
    missing, extra, pairs = _leftovers(ref_keys, comp_keys, _slots(reference), _slots(composite))
    missing, extra, pairs = _by_chance(ref_keys, comp_keys, missing, extra, pairs)
    ref_marks, comp_marks = [MARK_OK] * len(ref_keys), [MARK_OK] * len(comp_keys)
    for i in missing:
        ref_marks[i] = MARK_LOST
    for j in extra:
        comp_marks[j] = MARK_DUPLICATED
    for i, j in pairs:
        ref_marks[i] = comp_marks[j] = MARK_EPOCH
    if missing or extra or pairs:
        return "".join(ref_marks), "".join(comp_marks)
    order = "".join(MARK_REORDERED if i >= len(ref_keys) or k != ref_keys[i] else MARK_OK
                    for i, k in enumerate(comp_keys))
    return "".join(ref_marks), order


def _key(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _beyond(keys: Sequence[tuple[Any, Any]], available: Counter) -> list[bool]:
    """For each key in order: is this occurrence beyond what ``available`` holds of it?"""
    seen: Counter = Counter()
    out = []
    for k in keys:
        seen[k] += 1
        out.append(seen[k] > available[k])
    return out


# -- helpers ---------------------------------------------------------------------------------------

def _call_finding(runs: Sequence[RunRecord | None], who: Any) -> Finding | None:
    """The first report call a run made out of order (``resumed`` twice, inputs after ``step_end``, a
    step past the case's last): the ledgers of such a run mean nothing."""
    for index, rec in enumerate(runs):
        text = next((e.text for e in rec.events if e.kind == ev.VIOLATION), None) if rec is not None else None
        if text:
            return Finding(PROTOCOL, MSG_CALLS.format(who=who(index), what=text))
    return None


def _process_finding(rec: RunRecord, who: str, resumed: bool, run: int = 0) -> Finding:
    """The finding of a run that did not end as planned: its outcome was ``hung`` (category ``HUNG``), it
    raised while resuming (``RESUME_ERROR``), or it ended any other way (``CRASHED``)."""
    if rec.outcome == Outcome.HUNG:
        return Finding(HUNG, _hung_headline(rec, who))
    disk = DISK_FULL if any(m in (rec.error or "") for m in DISK_FULL_MARKERS) else ""
    if rec.outcome == Outcome.RAISED and resumed:
        return Finding(RESUME_ERROR, MSG_RESUME_ERROR.format(run=run, error=_last_line(rec.error)) + disk)
    return Finding(CRASHED, MSG_CRASHED.format(who=who, what=rec.describe()) + disk)


def _hung_headline(rec: RunRecord, who: str) -> str:
    """What a hung run failed to do: report at all (a command, or a child forked from the preloaded server),
    what it was waited for (``stalled``), or send anything after its last step; then where its stacks are
    (:func:`_stacks_named`)."""
    if not rec.events and rec.plan.command is not None:
        what = MSG_HUNG_COMMAND_AT_START.format(who=who, timeout=f"{rec.hang_timeout:g}",
                                                argv=" ".join(rec.plan.command.argv))
    elif not rec.events and rec.isolation == ISOLATION_FORKSERVER:
        what = MSG_HUNG_AT_START.format(who=who, timeout=f"{rec.hang_timeout:g}")
    elif rec.stalled:
        what = MSG_HUNG_STALLED.format(who=who, what=rec.stalled)
    else:
        what = MSG_HUNG.format(who=who, timeout=f"{rec.hang_timeout:g}", step=rec.last_step)
    return what + _stacks_named(rec)


def _stacks_named(rec: RunRecord) -> str:
    """The end of a hung run's headline that names the log holding its processes' stacks (none when no
    process wrote them): a hang in the trainer's code is the trainer's to find, and the log says where."""
    written = rec.stacks_in_log
    if not written:
        return ""
    if written == [None]:
        return MSG_HUNG_STACK.format(path=rec.plan.log_path)
    if len(written) == len(rec.stack_dumps):
        return MSG_HUNG_STACKS.format(path=rec.plan.log_path)
    ranks = sorted(rank or 0 for rank in written)
    named = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return MSG_HUNG_STACKS_OF.format(ranks=named, path=rec.plan.log_path)


def _last_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no traceback)"


def _keys(ledger: Ledger) -> list[tuple[Any, int]]:
    return [(e.id, e.epoch) for e in ledger]


def first_difference(reference: Ledger, composite: Ledger) -> int | None:
    """The index of the first entry where the two ledgers differ (by id and epoch; the end of the shorter
    one when it is a prefix of the other), None when they are equal."""
    return _first_difference(_keys(reference), _keys(composite))


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _where_run(run: int, labels: Sequence[str]) -> str:
    """The label of the resume that started run ``run`` (0 is the first run: its first resume)."""
    if not labels:
        return "the run"
    return labels[_resume_of_run(run, labels)]


def _resume_of_run(run: int, labels: Sequence[str]) -> int:
    """Which resume (an index into ``labels``) started run ``run`` (0 is the first run: its first resume)."""
    return max(min(max(run, 1), len(labels)) - 1, 0)


def _resume_of_step(step: int, labels: Sequence[str], resumed_from: Sequence[int]) -> int:
    """Which resume (an index into ``labels``) is the last one before ``step`` (the first if none is)."""
    chosen = 0
    for index, at in enumerate(resumed_from[:len(labels)]):
        if at < step:
            chosen = index
    return chosen


def _by_resume(entries: Sequence[Entry], resume_of: Callable[[Entry], int],
               labels: Sequence[str]) -> list[tuple[str, list[Entry]]]:
    """``entries`` grouped by the resume ``resume_of`` blames each on, in the order of the resumes, each
    group with the resume's label (with ``(run N)`` where two of the groups' resumes have the same label)."""
    if not labels:
        return [("the run", list(entries))]
    groups: dict[int, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(resume_of(entry), []).append(entry)
    named = [labels[i] for i in sorted(groups)]
    return [(labels[i] + (f" (run {i + 2})" if named.count(labels[i]) > 1 else ""), groups[i])
            for i in sorted(groups)]


def _on_rank(finding: Finding, rank: int) -> Finding:
    """A finding of one rank's own ledger, saying so (``REORDERED on rank 1: ...``) and naming the rank."""
    if " on rank" in finding.headline:
        return replace(finding, rank=rank)
    head, sep, rest = finding.headline.partition(":")
    return replace(finding, rank=rank, headline=f"{head} on rank {rank}{sep}{rest}" if finding.category == REORDERED
                   else finding.headline.replace(" after ", f" on rank {rank} after ", 1))


def _ranks_text(entries: Sequence[Entry]) -> str:
    """`` on rank 1`` / `` on ranks 0, 1`` for entries of a multi-rank run ('' for one process)."""
    ranks = sorted({e.rank for e in entries if e.rank is not None})
    if not ranks:
        return ""
    return f" on rank {ranks[0]}" if len(ranks) == 1 else " on ranks " + ", ".join(map(str, ranks))


def _id_finding(category: str, template: str, groups: Sequence[tuple[str, list[Entry]]], kind: str,
                pos: int | None) -> Finding:
    """A LOST or DUPLICATED finding of ``groups`` (the label of a resume, the entries blamed on it): the
    first group in ``template``, each further one as :data:`MSG_MORE_AFTER` after ``; ``."""
    parts, listed = [], 0
    for index, (where, group) in enumerate(groups):
        epochs = sorted({e.epoch for e in group})
        epoch_text = f"epoch {epochs[0]}" if len(epochs) == 1 else "epochs " + ", ".join(map(str, epochs))
        group_ids = list(dict.fromkeys(e.id for e in group))  # each id once, in order of appearance
        part = (template if index == 0 else MSG_MORE_AFTER).format(
            n=len(group_ids), s=_s(len(group_ids)), where=where, ids=_id_list(group_ids), epochs=epoch_text)
        parts.append(part.replace(" after ", _ranks_text(group) + " after ", 1))
        listed += len(group_ids)
    entries = [e for _, group in groups for e in group]
    ids = list(dict.fromkeys(e.id for e in entries))
    headline = "; ".join(parts)
    if len(entries) > listed:
        headline += f"; {len(entries)} occurrences in all"
    if kind != "consumed":
        headline += f" [{kind} ledger]"
    return Finding(category, headline, kind, tuple(ids), pos, min(e.step for e in entries))


def _id_list(ids: Sequence[Any]) -> str:
    shown = ", ".join(str(i) for i in ids[:MAX_IDS])
    return shown + (f", ... ({len(ids) - MAX_IDS} more)" if len(ids) > MAX_IDS else "")


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _pair_detail(a: Ledger, b: Ledger, pos: int | None) -> str:
    if pos is None:
        return "identical"
    left = f"{a[pos].id}@e{a[pos].epoch}" if pos < len(a) else "end"
    right = f"{b[pos].id}@e{b[pos].epoch}" if pos < len(b) else "end"
    return f"reference has {left}, resumed has {right}"
