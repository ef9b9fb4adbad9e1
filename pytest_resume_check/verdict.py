"""Judge an interrupted run against the uninterrupted reference.

Process problems come first (a resumed run that raised, a run that died or hung): with those the
ledgers mean nothing. Otherwise each ledger the contract names is composed and compared with the
reference ledger: inputs missing (LOST), inputs taken more often (DUPLICATED), the same inputs with
other epoch labels (EPOCH), and - for ordered contracts - the same inputs in another order (REORDERED).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_resume_check import events as ev
from pytest_resume_check import results as rs
from pytest_resume_check.categories import (  # noqa: F401  (re-exported: tests and users import them here)
    CRASHED,
    DUPLICATED,
    EPOCH,
    HUNG,
    LOST,
    NONDETERMINISTIC,
    PROTOCOL,
    REORDERED,
    RESUME_ERROR,
    SILENT_IO_ERROR,
    STALE_RESUME,
    STATE_DIVERGED,
    VERDICT_CATEGORIES,
)
from pytest_resume_check.faults import ERROR
from pytest_resume_check.ledger import Entry, Ledger, ResumeReportMissing, compose
from pytest_resume_check.results import Finding, RunRecord, Verdict
from pytest_resume_check.state_verdict import (  # noqa: F401  (MSG_* re-exported for tests)
    MSG_STALE,
    MSG_STALE_PUBLISHED,
    MSG_STATE_DIVERGED,
    MSG_STATE_NONDETERMINISTIC,
    MSG_UNPUBLISHED,
    judge_reference_state,
    judge_restored,
    judge_state,
)

if TYPE_CHECKING:
    from pytest_resume_check.targets import Contract

#: Headline templates; tests import these rather than repeating the words.
MSG_LOST = "LOST {n} input{s} after {where}: ids {ids} ({epochs})"
MSG_DUPLICATED = "DUPLICATED {n} input{s} after {where}: ids {ids} ({epochs})"
MSG_EPOCH = "EPOCH labels differ for {n} input{s} after {where}: ids {ids} ({detail})"
MSG_REORDERED = "REORDERED: same inputs, other order after {where}, from position {pos}: {detail}"
MSG_RESUME_ERROR = "RESUME_ERROR: run {run} raised while resuming: {error}"
MSG_CRASHED = "CRASHED: {who} {what}"
MSG_HUNG = "HUNG: {who} sent no event for {timeout} s after step {step}; it was killed"
MSG_HUNG_AT_START = ("HUNG: {who} sent no event at all within {timeout} s of being forked from the preloaded "
                     "server; the trainer may not be fork-safe (threads or locks held at fork time): declare "
                     "the target with isolation='spawn' or run with --resume-matrix-isolation=spawn")
MSG_NONDETERMINISTIC = "NONDETERMINISTIC reference: two uninterrupted runs differ from position {pos}: {detail}"
MSG_PROTOCOL = "PROTOCOL: {detail}"
MSG_EMPTY = ("PROTOCOL: the reference run reported no {kind} inputs; the target must call "
             "run.{kind}(ids, step=..., epoch=...) for what it takes (or drop '{kind}' from its contract)")
MSG_SILENT_IO = ("SILENT_IO_ERROR: an injected {error} at file operation {op} of the save of step {step} did not "
                 "fail the run ({what}); the checkpoint may be incomplete and nobody knows")
MSG_STEPS = "PROTOCOL: the target declares {declared} steps for this case but its reference run took {actual}"
MSG_CALLS = "PROTOCOL: {who} {what}"
#: Appended to a failing run's headline when its error is a full disk.
DISK_FULL = "; the disk is full (No space left on device): free space there or point --basetemp at a bigger disk"
DISK_FULL_MARKERS = ("No space left on device", "ENOSPC", "[Errno 28]")

MAX_IDS = 10
#: Categories found by comparing ledgers.
LEDGER_CATEGORIES = frozenset({LOST, DUPLICATED, EPOCH, REORDERED})


def resume_label(step: int | None, path: str | None) -> str:
    """``resume from global_step_3`` / ``restart from scratch``."""
    if not step:
        return "restart from scratch"
    return f"resume from {os.path.basename(os.path.normpath(path))}" if path else f"resume from step {step}"


def judge_reference(first: RunRecord, second: RunRecord | None, declared_steps: int | None,
                    contract: Contract) -> list[Finding]:
    """Problems of the reference itself: it must finish, take the declared steps, and repeat."""
    calls = _call_finding([first, second], lambda i: "the reference run")
    if calls is not None:
        return [calls]
    for rec in (first, second):
        if rec is not None and rec.outcome != rs.DONE:
            return [_process_finding(rec, "the reference run", resumed=False)]
    for kind in contract.ledgers:
        if not Ledger.from_events(first.events, kind):
            return [Finding(PROTOCOL, MSG_EMPTY.format(kind=kind))]
    if declared_steps is not None and first.last_step != declared_steps:
        return [Finding(PROTOCOL, MSG_STEPS.format(declared=declared_steps, actual=first.last_step))]
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


def judge(reference: RunRecord, runs: Sequence[RunRecord], contract: Contract,
          newest_complete: int | None = None) -> Verdict:
    """Judge the interrupted ``runs`` (first, then each resumed one) against ``reference``.

    ``newest_complete``: for a fault in a save, the newest checkpoint that was complete at the fault;
    the first resumed run must not start from anything older (STALE_RESUME).
    """
    verdict = Verdict()
    calls = _call_finding(runs, lambda i: f"run {i + 1} of {len(runs)}")
    if calls is not None:
        verdict.findings.append(calls)
        return verdict
    fault = runs[0].plan.faults if runs else None
    if fault is not None and fault.mode == ERROR and runs[0].outcome != rs.RAISED:
        verdict.findings.append(Finding(SILENT_IO_ERROR, MSG_SILENT_IO.format(
            error=os.strerror(fault.errno or 5), op=fault.op, step=fault.step, what=runs[0].describe())))
        return verdict
    for index, rec in enumerate(runs):
        if rec.outcome in (rs.DONE, rs.KILLED, rs.CONVERGED):
            continue
        if index == 0 and fault is not None and rec.outcome == rs.RAISED:
            continue  # the injected I/O error made the save fail loudly, as it must
        who = f"run {index + 1} of {len(runs)}"
        verdict.findings.append(_process_finding(rec, who, resumed=rec.plan.is_resume, run=index + 1))
        return verdict
    if runs and runs[-1].outcome not in rs.FINISHED:
        verdict.findings.append(Finding(PROTOCOL, MSG_PROTOCOL.format(detail="the last run was killed")))
        return verdict
    restored = judge_restored(runs, newest_complete)
    verdict.findings.extend(restored)
    if any(f.category == PROTOCOL for f in restored):
        return verdict  # cut at a step no run reached, the ledgers mean nothing
    for kind in contract.ledgers:
        ref = Ledger.from_events(reference.events, kind)
        try:
            comp, resumed_from = compose([r.events for r in runs], kind)
        except ResumeReportMissing as exc:
            verdict.findings.append(Finding(PROTOCOL, MSG_PROTOCOL.format(detail=exc)))
            return verdict
        converged = runs[-1].converged_step if runs else None
        if converged is not None:
            # From here the resumed run's state equals the reference's: the reference's rest is its rest.
            tail = (Entry(e.id, e.step, e.epoch, len(runs)) for e in ref if e.step > converged)
            comp = Ledger(comp + Ledger(tail))
        verdict.resumed_from = resumed_from
        verdict.resume_labels = [resume_label(r.resumed_step, r.resumed_path) for r in runs[1:]]
        if kind == contract.ledgers[0]:
            verdict.reference, verdict.composite = ref, comp
        verdict.findings.extend(compare(ref, comp, contract.ordered, kind, verdict.resume_labels,
                                        resumed_from))
    state = judge_state(reference, runs, verdict.resume_labels)
    inputs_differ = [f.step for f in verdict.findings if f.category in LEDGER_CATEGORIES and f.step is not None]
    if state is not None and (not inputs_differ or state.step < min(inputs_differ)):
        # State that differs only from where the inputs did is their consequence, not a second finding.
        verdict.findings.append(state)
    return verdict


def compare(ref: Ledger, comp: Ledger, ordered: bool, kind: str = "consumed",
            labels: Sequence[str] = (), resumed_from: Sequence[int] = ()) -> list[Finding]:
    """Findings of one ledger against its reference (empty when they agree under the contract)."""
    ref_left = Counter((e.id, e.epoch) for e in ref)
    comp_left = Counter((e.id, e.epoch) for e in comp)
    common = ref_left & comp_left
    ref_left -= common
    comp_left -= common
    # Leftovers that match by id alone were taken, but labelled with another epoch.
    by_id_ref = Counter(i for i, _ in ref_left.elements())
    by_id_comp = Counter(i for i, _ in comp_left.elements())
    relabelled = by_id_ref & by_id_comp
    lost_ids = by_id_ref - relabelled
    dup_ids = by_id_comp - relabelled
    pos = _first_difference(_keys(ref), _keys(comp))
    findings = []
    where = _where(ref, comp, pos, labels, resumed_from)
    if lost_ids:
        entries = _pick(ref, lost_ids, ref_left)
        findings.append(_id_finding(LOST, MSG_LOST, entries, _where_step(entries[0].step, labels, resumed_from),
                                    kind, pos))
    if dup_ids:
        entries = _pick(comp, dup_ids, comp_left)
        findings.append(_id_finding(DUPLICATED, MSG_DUPLICATED, entries,
                                    _where_step(entries[0].step, labels, resumed_from), kind, pos))
    if relabelled:
        ids = sorted(relabelled, key=ref.ids.index)
        ref_ep = {i: e for i, e in ref_left if i in relabelled}
        comp_ep = {i: e for i, e in comp_left if i in relabelled}
        detail = ", ".join(f"{i}: epoch {comp_ep[i]} instead of {ref_ep[i]}" for i in ids[:3])
        first = min(e.step for e in ref if e.id in relabelled)
        findings.append(Finding(EPOCH, MSG_EPOCH.format(
            n=sum(relabelled.values()), s=_s(sum(relabelled.values())), where=where,
            ids=_id_list(ids), detail=detail), kind, tuple(ids), pos, first))
    if not findings and ordered and pos is not None:
        findings.append(Finding(REORDERED, MSG_REORDERED.format(
            where=where, pos=pos, detail=_pair_detail(ref, comp, pos)), kind, position=pos,
            step=(ref[pos] if pos < len(ref) else comp[pos]).step))
    return findings


#: Marks of one ledger entry (:func:`entry_marks`): matched, or why not.
MARK_OK, MARK_LOST, MARK_DUPLICATED, MARK_REORDERED, MARK_EPOCH = ".", "L", "D", "R", "E"


def entry_marks(reference: Sequence[Sequence[Any]], composite: Sequence[Sequence[Any]]) -> tuple[str, str]:
    """Marks for each entry of both ledgers (rows ``[id, step, epoch, run]``), one character each.

    Entries are matched by (id, epoch) as the verdict does. A reference entry without a match is
    ``LOST``; a composite entry beyond the reference's count is ``DUPLICATED``; unmatched pairs that
    agree on the id differ only in their epoch label (``EPOCH``). When nothing is missing or extra,
    composite entries that stand where the reference has another input are ``REORDERED``.
    """
    ref_keys = [(_key(r[0]), r[2]) for r in reference]
    comp_keys = [(_key(r[0]), r[2]) for r in composite]
    ref_missing = _beyond(ref_keys, Counter(comp_keys))
    comp_extra = _beyond(comp_keys, Counter(ref_keys))
    relabel = (Counter(k[0] for k, m in zip(ref_keys, ref_missing) if m)
               & Counter(k[0] for k, x in zip(comp_keys, comp_extra) if x))
    ref_marks = _mark(ref_keys, ref_missing, Counter(relabel), MARK_LOST)
    comp_marks = _mark(comp_keys, comp_extra, Counter(relabel), MARK_DUPLICATED)
    if ref_marks.strip(MARK_OK) or comp_marks.strip(MARK_OK):
        return ref_marks, comp_marks
    order = "".join(MARK_REORDERED if i >= len(ref_keys) or k != ref_keys[i] else MARK_OK
                    for i, k in enumerate(comp_keys))
    return ref_marks, order


def _key(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _beyond(keys: list[tuple[Any, Any]], available: Counter) -> list[bool]:
    """For each key in order: is this occurrence beyond what ``available`` holds of it?"""
    seen: Counter = Counter()
    out = []
    for k in keys:
        seen[k] += 1
        out.append(seen[k] > available[k])
    return out


def _mark(keys: list[tuple[Any, Any]], flagged: list[bool], relabel: Counter, mark: str) -> str:
    out = []
    for (ident, _), flag in zip(keys, flagged):
        if not flag:
            out.append(MARK_OK)
        elif relabel[ident] > 0:
            relabel[ident] -= 1
            out.append(MARK_EPOCH)
        else:
            out.append(mark)
    return "".join(out)


# -- helpers ---------------------------------------------------------------------------------------

def _call_finding(runs: Sequence[RunRecord | None], who: Any) -> Finding | None:
    """The first report call a run made out of order (``resumed`` twice, inputs after ``step_end``, a
    step past the case's last): the ledgers of such a run mean nothing."""
    for index, rec in enumerate(runs):
        text = next((e.text for e in rec.events if e.kind == ev.PROTOCOL), None) if rec is not None else None
        if text:
            return Finding(PROTOCOL, MSG_CALLS.format(who=who(index), what=text))
    return None


def _process_finding(rec: RunRecord, who: str, resumed: bool, run: int = 0) -> Finding:
    if rec.outcome == rs.HUNG and not rec.events and rec.isolation == "forkserver":
        return Finding(HUNG, MSG_HUNG_AT_START.format(who=who, timeout=f"{rec.hang_timeout:g}"))
    if rec.outcome == rs.HUNG:
        return Finding(HUNG, MSG_HUNG.format(who=who, timeout=f"{rec.hang_timeout:g}", step=rec.last_step))
    disk = DISK_FULL if any(m in (rec.error or "") for m in DISK_FULL_MARKERS) else ""
    if rec.outcome == rs.RAISED and resumed:
        return Finding(RESUME_ERROR, MSG_RESUME_ERROR.format(run=run, error=_last_line(rec.error)) + disk)
    return Finding(CRASHED, MSG_CRASHED.format(who=who, what=rec.describe()) + disk)


def _last_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no traceback)"


def _keys(ledger: Ledger) -> list[tuple[Any, int]]:
    return [(e.id, e.epoch) for e in ledger]


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _where(ref: Ledger, comp: Ledger, pos: int | None, labels: Sequence[str],
           resumed_from: Sequence[int]) -> str:
    """The resume the divergence follows: the last one at or before the diverging step."""
    if not labels:
        return "the run"
    if pos is None:
        return labels[0]
    return _where_step((ref[pos] if pos < len(ref) else comp[pos]).step, labels, resumed_from)


def _where_step(step: int, labels: Sequence[str], resumed_from: Sequence[int]) -> str:
    """The label of the last resume before ``step`` (the first one if none is before it)."""
    if not labels:
        return "the run"
    chosen = labels[0]
    for label, at in zip(labels, resumed_from):
        if at < step:
            chosen = label
    return chosen


def _pick(ledger: Ledger, wanted: Counter, leftover: Counter) -> list[Entry]:
    """Entries of ``ledger`` that account for ``wanted`` ids, preferring unmatched (id, epoch) pairs."""
    need = Counter(wanted)
    spare = Counter(leftover)
    out = []
    for e in ledger:
        if need[e.id] > 0 and spare[(e.id, e.epoch)] > 0:
            need[e.id] -= 1
            spare[(e.id, e.epoch)] -= 1
            out.append(e)
    return out


def _id_finding(category: str, template: str, entries: list[Entry], where: str, kind: str,
                pos: int | None) -> Finding:
    epochs = sorted({e.epoch for e in entries})
    epoch_text = f"epoch {epochs[0]}" if len(epochs) == 1 else "epochs " + ", ".join(map(str, epochs))
    ids = list(dict.fromkeys(e.id for e in entries))  # each id once, in order of appearance
    headline = template.format(n=len(ids), s=_s(len(ids)), where=where, ids=_id_list(ids), epochs=epoch_text)
    if len(entries) > len(ids):
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
