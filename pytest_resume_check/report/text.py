"""How a verdict reads: one headline, an excerpt around the first divergence, the story of the runs,
where the files are, and the command that reruns exactly this cell."""

from __future__ import annotations

import json
import os
import re
import shlex
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest_resume_check
from pytest_resume_check.categories import HARNESS, status
from pytest_resume_check.judge.state_verdict import step_unit_of
from pytest_resume_check.judge.verdict import entry_marks, first_difference, run_label
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.cell_json import (
    CellJson,
    CommitJson,
    EnvironmentJson,
    RunJson,
    StacksJson,
    ThreadJson,
)
from pytest_resume_check.records.environ import harness_names
from pytest_resume_check.records.ledger import CONSUMED, Ledger
from pytest_resume_check.records.names import OPT_CELL, OPT_MATRIX, OPT_SEED, REFERENCE
from pytest_resume_check.records.plan import LAUNCHER_HARNESS, KillSpec
from pytest_resume_check.records.results import AS_PLANNED, CellResult, Outcome, RunRecord, Verdict
from pytest_resume_check.report import known_findings
from pytest_resume_check.report.summary import ENVIRONMENT_KEY, MSG_COMMIT_RECOGNISED, MSG_RAN_FRESH, RAN_FRESH_KEY

#: The story of a cell whose reference failed (no interrupted run was made).
NO_RUNS = "no interrupted run (the reference itself failed)"
EXCERPT_BEFORE = 4
EXCERPT_AFTER = 6
#: A run's log in a failure report: its last lines (``run.log`` lines, the child's stdout and stderr).
LOG_LINES = 6
#: In the JSON report: at most this many last lines of each run's log.
LOG_LINES_JSON = 20
#: Of a log, only its last bytes are read, and each line is cut to this many characters.
LOG_TAIL_BYTES = 16384
LOG_LINE_CHARS = 240

#: Characters a terminal acts on instead of showing: C0 controls but newline and tab (ESC starts the sequences
#: that set the window title or clear the screen, CR writes over the line), DEL, C1 controls (CSI among them),
#: and the bidirectional overrides that show text in another order than it has.
_ACTING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` as the terminal may print it: each character a terminal would act on shown as its Python
    escape (ESC as ``\\x1b``). The harness prints what a trainer wrote (its exception, its log lines) in
    headlines and reports; JSON keeps the raw text (escaped by JSON) and HTML escapes it itself."""
    return _ACTING.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


#: Above the excerpt when it is not the plain consumed ledger (:func:`evidence_title`): the ledger its lines
#: show, of which rank, and the other ledgers that differ too (their findings follow as ``also:`` lines).
EVIDENCE_TITLE = "{ledger} ledger{rank}{others}"
EVIDENCE_RANK = " of rank {rank}"
EVIDENCE_OTHERS = " (the {others} ledger{s} differ{verb} too)"


def excerpt(reference: Ledger, composite: Ledger) -> list[str]:
    """Two aligned lines of ids around the first entry where the two sequences differ (by id and epoch),
    which ``[x]`` marks (``[end]``: the shorter one ends there); ``|`` marks where a resumed run's entries
    begin. No lines when they are equal."""
    position = first_difference(reference, composite)
    if position is None:
        return []
    lo = max(0, position - EXCERPT_BEFORE)
    hi = position + EXCERPT_AFTER

    def line(ledger: Ledger) -> str:
        cells = []
        for i in range(lo, min(hi, len(ledger))):
            e = ledger[i]
            text = f"{e.id}@e{e.epoch}"
            if i == position:
                text = f"[{text}]"
            if i > 0 and ledger[i - 1].run != e.run:
                text = "| " + text
            cells.append(text)
        if position >= len(ledger):
            cells.append("[end]")
        return ("... " if lo else "") + " ".join(cells) + (" ..." if hi < len(ledger) else "")

    return [f"  reference: {line(reference)}", f"  resumed:   {line(composite)}"]


def evidence_title(ledger: str | None, others: Sequence[str] = (), rank: int | None = None) -> str | None:
    """What a cell's evidence shows, when it is not the plain consumed ledger of the whole job (None then):
    ``trained ledger (the consumed ledger differs too)``, ``consumed ledger of rank 1``."""
    if ledger is None or (ledger == CONSUMED and not others and rank is None):
        return None
    many = len(others) > 1
    also = EVIDENCE_OTHERS.format(others=" and ".join(others), s="s" if many else "",
                                  verb="" if many else "s") if others else ""
    return EVIDENCE_TITLE.format(ledger=ledger, rank=EVIDENCE_RANK.format(rank=rank) if rank is not None else "",
                                 others=also)


def evidence_lines(verdict: Verdict) -> list[str]:
    """The excerpt of a verdict's evidence (:meth:`Verdict.evidence`: the ledger its first finding about
    inputs is about, one rank's own for a finding of one rank), under its :func:`evidence_title` when it
    has one; none when the two sequences are equal."""
    shown = verdict.evidence()
    reference, composite = shown.reference, shown.composite
    if shown.rank is not None:
        reference, composite = reference.of_rank(shown.rank), composite.of_rank(shown.rank)
    lines = excerpt(reference, composite)
    title = evidence_title(shown.ledger, shown.others, shown.rank)
    return [f"  {title}:", *lines] if lines and title else lines


def story(result: CellResult) -> str:
    """``run 1: killed right after ... -> run 2: resume from global_step_3, ran to the end``."""
    parts = []
    for i, rec in enumerate(result.runs):
        text = f"run {i + 1}"
        if i:
            text += f" ({run_label(rec)})"
        text += f": {rec.describe()}"
        if rec.leftovers:
            text += f" ({rec.leftovers} process{'es' if rec.leftovers > 1 else ''} it detached killed after it)"
        parts.append(text)
    return " -> ".join(parts)


def log_tail(path: str | Path | None, lines: int, without: str | None = None, only: str | None = None,
             hung: bool = False) -> list[str]:
    """The last ``lines`` non-empty lines of a run's log file (none if it is missing or empty), each cut
    to a readable length; ``without``: text to leave out (a traceback the report already shows); ``only``:
    just the lines that start with it; ``hung``: the log of a hung run, whose output ends where the stacks
    the harness had it write begin (:func:`stacks`)."""
    text = _read_tail(path, STACKS_TAIL_BYTES if hung else LOG_TAIL_BYTES)
    if hung:
        text = _split_stacks(text)[0][-LOG_TAIL_BYTES:]
    if without and without.strip() and without.strip() in text:
        text = text.replace(without.strip(), "")
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip() and (only is None or ln.startswith(only))][-lines:]
    return [_cut(ln) for ln in kept]


def _cut(line: str) -> str:
    return line if len(line) <= LOG_LINE_CHARS else line[:LOG_LINE_CHARS - 3] + "..."


def _read_tail(path: str | Path | None, size: int) -> str:
    """The last ``size`` bytes of a file as text ('' if there is none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# -- where a hung run hung -------------------------------------------------------------------------

#: Of a hung run's log, this many last bytes are searched for the stacks it wrote before it was killed.
STACKS_TAIL_BYTES = 1 << 20
#: In the JSON report: at most this many innermost frames of each thread.
STACK_FRAMES_JSON = 30
#: In a failure report: the innermost frames of each thread shown (and the trainer's innermost frame, if
#: it is deeper).
STACK_FRAMES = 5
STACKS_HEADER_PATTERN = ev.STACKS_HEADER_PATTERN
_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<function>.*)$')


def _split_stacks(text: str) -> tuple[str, list[tuple[re.Match[str], str]]]:
    """A log's text before the first stacks header, and each header with the text under it."""
    headers = list(STACKS_HEADER_PATTERN.finditer(text))
    if not headers:
        return text, []
    ends = [h.start() for h in headers[1:]] + [len(text)]
    return text[:headers[0].start()], [(h, text[h.end():end]) for h, end in zip(headers, ends)]


def stacks(path: str | Path | None, frames: int | None = None) -> list[StacksJson]:
    """The Python stacks a hung run's processes wrote into its log before they were killed
    (``process.supervisor.dump_stacks``), one entry per process: its ``rank`` (None in a one-process run),
    ``pid`` and ``threads`` as faulthandler lists them, each with its ``frames`` innermost first
    (``file``, ``line``, ``function``; at most ``frames`` of them) and whether it is the ``main`` thread
    (the one it lists last)."""
    out: list[StacksJson] = []
    for header, body in _split_stacks(_read_tail(path, STACKS_TAIL_BYTES))[1]:
        threads: list[ThreadJson] = []
        for line in body.splitlines():
            thread, frame = _THREAD.match(line), _FRAME.match(line)
            if thread:
                threads.append({"thread": thread["id"], "main": False, "frames": []})
            elif frame and threads and (frames is None or len(threads[-1]["frames"]) < frames):
                number = frame["line"]
                threads[-1]["frames"].append({"file": frame["file"], "line": int(number) if number.isdigit() else None,
                                              "function": frame["function"]})
        if threads:
            threads[-1]["main"] = True  # CPython lists the newest thread first, the main thread last
        out.append({"rank": int(header["rank"]) if header["rank"] is not None else None, "pid": int(header["pid"]),
                    "threads": threads})
    return out


def _harness_dir() -> str:
    return os.path.dirname(os.path.abspath(pytest_resume_check.__file__)) + os.sep


#: Folders of the harness's bundled targets: their frames are a trainer's, not the harness's.
_BUNDLED = ("builtin", "integrations")


def is_trainer_frame(file: str) -> bool:
    """Whether a frame's file is the trainer's own code: not Python's standard library, not an installed
    package (site-packages), not the harness (its bundled targets are trainers)."""
    if file.startswith("<"):
        return False  # <frozen importlib._bootstrap>, <string>
    path = os.path.abspath(file)
    harness = _harness_dir()
    if path.startswith(harness):
        return path[len(harness):].split(os.sep)[0] in _BUNDLED
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    paths = sysconfig.get_paths()
    return not any(path.startswith(os.path.abspath(paths[key]) + os.sep) for key in ("stdlib", "platstdlib"))


def _in_trainer(frames: Sequence[Mapping[str, Any]]) -> bool:
    return any(is_trainer_frame(f["file"]) for f in frames)


def _frame_line(frame: Mapping[str, Any]) -> str:
    """A frame as a traceback shows it."""
    line = frame["line"] if frame["line"] is not None else "???"
    return f'File "{frame["file"]}", line {line} in {frame["function"]}'


def stack_lines(processes: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a failure report shows of a hung run's stacks: per process, its main thread and each other thread
    that is in the trainer's code, with their :data:`STACK_FRAMES` innermost frames (and the trainer's
    innermost frame after ``...`` when it is deeper); a process that wrote none says so."""
    out = []
    for proc in processes:
        who = f"rank {proc['rank']} (pid {proc['pid']})" if proc["rank"] is not None else f"pid {proc['pid']}"
        threads = [t for t in proc["threads"] if t["main"]]
        threads += [t for t in proc["threads"] if not t["main"] and _in_trainer(t["frames"])]
        if not threads:
            out.append(f"{who}: {NO_STACKS}")
        for thread in threads:
            frames = thread["frames"]
            out.append(f"{who}, {'main thread' if thread['main'] else 'thread ' + thread['thread']}:")
            out += ["  " + _frame_line(f) for f in frames[:STACK_FRAMES]]
            deeper = next((f for f in frames[STACK_FRAMES:] if is_trainer_frame(f["file"])), None)
            if deeper is not None and not _in_trainer(frames[:STACK_FRAMES]):
                out += ["  ...", "  " + _frame_line(deeper)]
    return [_cut(ln) for ln in out]


#: A process that wrote no stack before it was killed.
NO_STACKS = ("wrote no stack (a program run as a command, or a process that hung before the harness installed its "
             "handler or whose code replaced it)")
#: Above the stacks in a failure report.
STACKS_TITLE = "  where {run} hung (innermost call first; every thread's whole stack is in {path}):"


def _log_lines(result: CellResult, shown_error: str | None) -> list[str]:
    """Each run's last ``run.log`` lines, under the run they belong to; of a run that did not end as
    planned (it raised, crashed or hung), its last output lines of any kind; of a hung run, then where
    each of its processes hung (:func:`stack_lines`)."""
    out = []
    for i, rec in enumerate(result.runs):
        as_planned = rec.outcome in AS_PLANNED
        hung = rec.outcome == Outcome.HUNG
        tail = log_tail(rec.plan.log_path, LOG_LINES, shown_error if rec.error == shown_error else None,
                        only=ev.LOG_PREFIX if as_planned else None, hung=hung)
        if tail:
            out.append(f"  log of run {i + 1} (last lines of {rec.plan.log_path}):")
            out += ["    " + ln for ln in tail]
        if hung:
            out += _where_hung(f"run {i + 1}", rec)
    reference = result.reference
    if reference is not None and reference.outcome == Outcome.HUNG and reference not in result.runs:
        out += _where_hung("the reference run", reference)
    return out


def _where_hung(who: str, rec: RunRecord) -> list[str]:
    """The report's lines on where a hung run's processes were (none if they wrote no stacks)."""
    where = stack_lines(stacks(rec.plan.log_path))
    return [STACKS_TITLE.format(run=who, path=rec.plan.log_path), *("    " + ln for ln in where)] if where else []


def failure_text(result: CellResult, rerun: str | None = None) -> str:
    """The whole failure report of one cell, for a terminal (:func:`visible`)."""
    v = result.verdict
    lines = [v.headline]
    known = known_findings.known_finding_json(result)
    if known is not None:  # a framework's own bug, documented on docs/findings.md
        lines.append(f"  {known_findings.line(known)}")
    lines += [f"  also: {f.headline}" for f in v.findings[1:]]
    lines += evidence_lines(v)
    if result.runs:
        lines.append(f"  runs: {story(result)}")
    contract = result.cell.target.contract.describe()
    if any(k.resume_world_size is not None for k in result.cell.kills):
        contract = ELASTIC_CONTRACT  # another world size: other batches, so the order and state are not judged
    lines.append(f"  target: {result.cell.target.name} (contract: {contract}); case {result.cell.case_id}")
    commit = commit_json(result)
    if commit is not None:
        lines.append("  " + (MSG_COMMIT_RECOGNISED if commit["recognised"] else MSG_COMMIT_DECLARED).format(
            target=result.cell.target.name, file=commit["file"]))
    fresh = environment_json(result)[RAN_FRESH_KEY]
    if fresh:
        lines.append("  " + MSG_RAN_FRESH.format(target=result.cell.target.name, names=", ".join(fresh)))
    shown_error = None
    for rec in result.runs:
        if rec.error and rec.outcome != Outcome.DONE:
            lines.append("  error of the failing run (last lines):")
            lines += ["    " + ln for ln in rec.error.strip().splitlines()[-6:]]
            shown_error = rec.error
            break
    lines += _log_lines(result, shown_error)
    if result.workdir is not None:
        lines.append(kept_line(result.workdir))
    lines.append(f"  seed: {result.seed}" if result.seed is not None else "")
    if rerun:
        lines.append(f"  rerun: {rerun}")
    lines = [ln for ln in lines if ln]
    return visible("\n".join(lines))


#: The line of a failing cell's report naming the folders it keeps (its own and its case's reference runs).
MSG_KEPT = ("  kept: {workdir} (checkpoints, run*.log, restored-run*: what each resume restored) and {reference} (the "
            "uninterrupted runs)")


def kept_line(workdir: Path) -> str:
    """The line naming the folders a failing cell keeps (a cluster node sends it with the cell's record, so the
    session can put what is true in its place when those folders could not be copied back)."""
    return MSG_KEPT.format(workdir=workdir, reference=workdir.parent / REFERENCE)


#: The contract of a cell that resumes at another world size (see docs/distributed.md).
ELASTIC_CONTRACT = "elastic resume: each epoch's inputs exactly once over all ranks, in any order"


#: A zero-change program's declared commit point in a failure report (a recognised one has the summary's line,
#: :data:`~pytest_resume_check.report.summary.MSG_COMMIT_RECOGNISED`).
MSG_COMMIT_DECLARED = "commit point: {file} (declared): its checkpoints are published when it names them"


def commit_json(result: CellResult) -> CommitJson | None:
    """``{"file": glob, "recognised": bool}``: the commit point the cell's runs followed, declared or recognised
    in the reference run (None: the target's checkpoints publish themselves, or it is no zero-change target)."""
    record = result.reference if result.reference is not None else (result.runs[0] if result.runs else None)
    command = result.cell.target.command
    if record is None or record.plan.commit is None or command is None:
        return None
    return {"file": record.plan.commit, "recognised": command.commit is None}


def cell_json(result: CellResult) -> CellJson:
    """Machine-readable verdict of one cell (for --resume-matrix-json; its keys: :class:`.cell_json.CellJson`)."""
    v = result.verdict
    shown = v.evidence()
    reference, composite = shown.reference.to_json(), shown.composite.to_json()
    ref_marks, comp_marks = entry_marks(reference, composite)
    cell: CellJson = {
        "target": result.cell.target.name,
        "case": dict(result.cell.case),
        "case_id": result.cell.case_id,
        "resume_mode": result.cell.resume_mode,
        "kill": result.cell.kill_id,
        "kills": [k.to_json() for k in result.cell.kills],
        "passed": v.passed,
        "xfail_reason": result.cell.xfail_reason,
        "categories": v.categories,
        "headline": v.headline,
        "known_finding": known_findings.known_finding_json(result),
        "resumed_from": v.resumed_from,
        "step_unit": step_unit_of(result.cell.target),
        "commit": commit_json(result),
        "state_diverged": v.state_diverged,
        "findings": [{"category": f.category, "headline": f.headline, "step": f.step, "ledger": f.ledger}
                     for f in v.findings],
        "ledger": shown.ledger,
        "reference": reference,
        "composite": composite,
        "marks": {"reference": ref_marks, "composite": comp_marks},
        "story": story(result) if result.runs else NO_RUNS,
        "runs": [_run_json(r) for r in result.runs],
        ENVIRONMENT_KEY: environment_json(result),
    }
    cell["status"] = status(cell)
    return cell




def environment_json(result: CellResult) -> EnvironmentJson:
    """The environment of a cell's runs (its case's reference included), names only: ``read``, the
    variables the project's code read that count (:mod:`pytest_resume_check.records.environ`), and
    ``harness``, those the harness set for the runs. The plugin adds ``declared``, and on a cluster
    ``differs``."""
    runs = [r for r in (result.reference, *result.runs) if r is not None]
    return {"read": sorted({name for r in runs for name in r.environ_read}),
            "harness": sorted({name for r in runs for name in harness_names(r.plan)}),
            RAN_FRESH_KEY: sorted({name for r in runs for name in r.ran_fresh})}



#: The story of a cell the harness could not judge (its worker crashed, or the harness failed).
NOT_JUDGED = "not judged (see the headline)"


def unjudged_cell_json(target: str, case_id: str, resume_mode: str, kills: Sequence[KillSpec], kill: str,
                       headline: str, category: str = HARNESS, case: Mapping[str, object] | None = None,
                       xfail_reason: str | None = None) -> CellJson:
    """The JSON form of a matrix cell that has no verdict (its pytest-xdist worker crashed, running it raised
    outside the engine: ``HARNESS``; its target cannot be run: ``TARGET_ERROR``), so the grid, the summary
    and the JSON count it."""
    cell: CellJson = {
        "target": target, "case": dict(case or {}), "case_id": case_id, "resume_mode": resume_mode, "kill": kill,
        "kills": [k.to_json() for k in kills], "passed": False, "xfail_reason": xfail_reason,
        "categories": [category],
        "headline": headline, "known_finding": None, "resumed_from": [], "state_diverged": None,
        "findings": [{"category": category, "headline": headline, "step": None, "ledger": None}], "ledger": None,
        "reference": [], "composite": [],
        "marks": {"reference": "", "composite": ""}, "story": NOT_JUDGED, "runs": [],
    }
    cell["status"] = status(cell)
    return cell


def _run_json(rec: RunRecord) -> RunJson:
    """One run of a cell: how it ended, its log; of a run stopped early, the step where its state equalled
    the reference's (``converged_step``); for multi-rank runs its world size, what each rank restored, the
    signal it got and who ended its ranks, under torchrun the launcher and which restart within the run it
    was (0: the run's first attempt; rows of ``reference`` and ``composite`` then carry the rank as a
    fifth item)."""
    # The outcome's plain value: the cell's JSON rides on a pytest-xdist report, whose serialiser takes
    # only exact built-in types (a str-Enum member is refused).
    hung = rec.outcome == Outcome.HUNG
    out: RunJson = {"outcome": rec.outcome.value, "exitcode": rec.exitcode, "seconds": round(rec.seconds, 3),
                           "log_file": rec.plan.log_path,
                           "log_tail": log_tail(rec.plan.log_path, LOG_LINES_JSON, hung=hung)}
    if hung:  # where it hung: each process's threads, their innermost frames first
        out["stacks"] = stacks(rec.plan.log_path, STACK_FRAMES_JSON)
    if rec.outcome == Outcome.CONVERGED:  # the early stop: from the next step on, the reference's entries
        out["converged_step"] = rec.converged_step
    if rec.plan.launcher != LAUNCHER_HARNESS:  # torchrun: which of its restarts within one run this was
        out["launcher"], out["restart"] = rec.plan.launcher, rec.plan.restart
    if rec.plan.world_size > 1 or rec.plan.master_port:
        out["world_size"] = rec.plan.world_size
        out["resumed_by_rank"] = {str(k): step for k, (step, _) in rec.resumed_by_rank.items()}
    if rec.signalled is not None:
        out["signalled"] = {"signal": rec.signalled.text, **rec.signalled.extra}
    if rec.teardown:
        out["teardown"] = rec.teardown
    return out


def rerun_command(cell_name: str, seed: int | None) -> str:
    """A rerun command for a cell whose JSON carries none (made by a script, not by the plugin, which
    writes each cell's own from its options, ``pytest_resume_check.plugin.commands.rerun_command``):
    ``pytest --resume-matrix --resume-matrix-seed=SEED --resume-matrix-cell=NAME``."""
    parts = ["pytest", OPT_MATRIX]
    if seed is not None:
        parts.append(f"{OPT_SEED}={seed}")
    parts.append(f"{OPT_CELL}={cell_name}")
    return " ".join(shlex.quote(str(p)) for p in parts)


#: Version of the JSON report's layout; raised when a key changes meaning or goes away (new keys may
#: come without it). 1: cells with ``findings``, ``state_diverged`` and ``runs[].log_tail``.
#: 2: ``reference``, ``composite`` and ``marks`` are the ledger ``ledger`` names, the one the first finding
#: about inputs is about (1: always the contract's first ledger); each finding names its ``ledger``.
JSON_FORMAT = 2


def dump_json(results: Sequence[CellJson], seed: int) -> str:
    return json.dumps({"format": JSON_FORMAT, "seed": seed, "cells": list(results)}, indent=1, sort_keys=True)
