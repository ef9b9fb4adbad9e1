"""The kill-id grammar, the one place that writes and reads it: ``ckpt3``, ``ckpt3+1:term5``,
``ckpt2_ckpt5``, ``save3op4:power``, a cell's name ``target[case-mode-kill]``, and the short labels
the grid and the HTML report show for a cell's kills.

Everything else reads a cell's structured kills (:meth:`KillSpec.to_json`), never the string.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_resume_check.records import faults
from pytest_resume_check.records.faults import FaultPlan
from pytest_resume_check.records.plan import RESUME_AUTO, RESUME_PATH, SIGNAL_TERM, KillSpec

#: A kill right after a checkpoint, and a fault inside a save: the two words a kill id starts with.
CKPT = "ckpt"
SAVE = "save"
#: The resume modes a cell is run in (a cell's name carries one).
CELL_RESUME_MODES = (RESUME_AUTO, RESUME_PATH)

#: Between the kills of a cell killed twice: ``ckpt1_ckpt7+1``; the old ``ckpt1,ckpt7+1`` is still read.
KILL_SEPARATOR = "_"
OLD_KILL_SEPARATOR = ","
#: Before the unsaved steps of a kill: ``ckpt3+1``.
UNSAVED = "+"
#: Before each suffix of a kill (``ckpt3:rank1``) and of a fault (``save3op4:power``).
SUFFIX = ":"
#: The distributed suffixes: SIGTERM with a grace period (``term5``), one rank alone killed
#: (``rank1``), resumed at another world size (``ws2``).
TERM = "term"
RANK = "rank"
WORLD = "ws"
#: A simulated node of a torchrun target killed whole: ``node1``; its agent alone: ``agent``; the lost node
#: back once the job without it published a checkpoint: ``node1:rejoin6``.
NODE = "node"
AGENT = "agent"
REJOIN = "rejoin"
#: Before a fault's file operation: ``save3op4``; the old ``save3@4`` is still read.
OP = "op"
OLD_OP = "@"
#: After an I/O error's name when every later operation fails too: ``enospc+``.
PERSISTENT = "+"
#: Between the kills of a cell in a grid column: ``1,7+1``.
COLUMN_SEPARATOR = ","
#: Between the case id, the resume mode and the kill id of a cell: ``shuffle-auto-ckpt3``.
CELL_SEPARATOR = "-"

_KIND_PART = re.compile(rf"({TERM})(\d+(?:\.\d+)?)|({RANK})(\d+)|({WORLD})(\d+)|({NODE})(\d+)|({AGENT})"
                        rf"|({REJOIN})(\d+)")
_SAVE_KILL = re.compile(rf"{SAVE}(\d+)(.*)$")
#: The rank of a fault in a save of several ranks, right after its operation: ``op7:rank1``.
_RANK_PART = re.compile(rf"{RANK}(\d+)(?=$|{SUFFIX})")
#: A thread of that rank besides its main one (an asynchronous save's writer): ``op3:rank0:thread1``.
THREAD = "thread"
_THREAD_PART = re.compile(rf"{THREAD}(\d+)(?=$|{SUFFIX})")
#: The power loss of one simulated node alone, after the fault's rank: ``op9:rank0:power:node1``.
_NODE_POWER = re.compile(rf"{faults.MODE_POWER}{SUFFIX}{NODE}(\d+)")
#: A cell's name: ``target[case-mode-kill]`` (the case id may hold dashes; the kill id starts with ckpt or save).
_CELL_NAME = re.compile(r"^(?P<target>[^\[]+)\[(?P<case>.*)" + re.escape(CELL_SEPARATOR) + "(?P<mode>"
                        + "|".join(CELL_RESUME_MODES) + ")" + re.escape(CELL_SEPARATOR)
                        + r"(?P<kill>(?:" + f"{CKPT}|{SAVE}" + r")[^\]]*)\]$")


# -- writing -------------------------------------------------------------------------------------------

def kill_id(kills: Sequence[KillSpec]) -> str:
    """``ckpt3`` (killed right after checkpoint 3), ``ckpt3+1`` (one unsaved step later),
    ``ckpt2_ckpt5`` (killed twice), ``save3op4:power`` (a fault in the save of step 3); distributed
    kinds add ``:rank1`` (rank 1 alone killed), ``:term5`` (SIGTERM, SIGKILL 5 s later), ``:ws1``
    (resumed with 1 rank), ``:node1`` (node 1 of a torchrun target killed whole; ``:node1:rejoin6``: back after
    checkpoint 6 of the job without it), ``:agent`` (its agent alone)."""
    return KILL_SEPARATOR.join(_one_kill(k) for k in kills)


def _one_kill(k: KillSpec) -> str:
    if k.fault is not None:
        return f"{SAVE}{k.checkpoint_step}{fault_label(k.fault)}"
    return CKPT + _point(k) + "".join(SUFFIX + part for part in kind_parts(k))


def _point(k: KillSpec) -> str:
    """``3`` or ``3+1``: the checkpoint and the unsaved steps after it."""
    return f"{k.checkpoint_step}" + (f"{UNSAVED}{k.extra_steps}" if k.extra_steps else "")


def kind_parts(k: KillSpec) -> tuple[str, ...]:
    """The distributed kind of one kill: ``term5``, ``rank1``, ``ws2`` (none for a plain SIGKILL of every
    rank, and for a fault in a save)."""
    if k.fault is not None:
        return ()
    parts = [f"{TERM}{k.grace:g}"] if k.signal == SIGNAL_TERM else []
    parts += [f"{RANK}{k.rank}"] if k.rank is not None else []
    parts += [f"{WORLD}{k.resume_world_size}"] if k.resume_world_size is not None else []
    parts += [f"{NODE}{k.node}"] if k.node is not None else []
    parts += [AGENT] if k.agent else []
    parts += [f"{REJOIN}{k.rejoin}"] if k.rejoin is not None else []
    return tuple(parts)


def fault_kind(plan: FaultPlan) -> str:
    """``crash``, ``power``, ``torn``, ``record``, or the injected error's name (``enospc``; ``eio+``
    when every later operation fails too)."""
    if plan.mode != faults.MODE_ERROR:
        return plan.mode
    name = next((k for k, v in faults.ERRNOS.items() if v == plan.errno), str(plan.errno))
    return name + (PERSISTENT if plan.persistent else "")


def fault_label(plan: FaultPlan) -> str:
    """``op4`` (killed before file operation 4), ``op4:power``, ``op4:torn:latest``, ``op4:enospc+`` ...:
    the kill id after ``save{step}``, in characters that pytest's ``-k`` can spell. In a save of several
    ranks the rank whose operation it is comes next, and the thread of it besides its main one: ``op7:rank1``,
    ``op7:rank1:power``, ``op3:rank0:thread1``; a power loss of one simulated node alone ends with it:
    ``op9:rank0:power:node1``."""
    parts = [f"{OP}{plan.op}"] + ([f"{RANK}{plan.rank}"] if plan.rank is not None else [])
    parts += [f"{THREAD}{plan.lane}"] if plan.lane else []
    if plan.mode == faults.MODE_TORN:
        parts += [faults.MODE_TORN, str(plan.file)]
    elif plan.mode != faults.MODE_CRASH:
        parts.append(fault_kind(plan))
    parts += [f"{NODE}{plan.node}"] if plan.node is not None else []
    return SUFFIX.join(parts)


def short_label(kills: Sequence[KillSpec]) -> str:
    """A grid column: ``3`` (killed right after checkpoint 3), ``3+1``, ``1,7+1`` (killed twice). The
    distributed kind is left to the row (:func:`kind_label`); a fault in a save keeps its kill id."""
    return COLUMN_SEPARATOR.join(_one_kill(k) if k.fault is not None else _point(k) for k in kills)


def kind_label(kills: Sequence[KillSpec]) -> str:
    """The distributed kinds of a cell's kills, each once: ``rank1``, ``term2``, ``rank1 ws3`` ('' for
    plain SIGKILLs of every rank)."""
    return " ".join(dict.fromkeys(part for k in kills for part in kind_parts(k)))


def cell_id(case_id: str, resume_mode: str, kill: str) -> str:
    """A cell's id within its target: ``shuffle-auto-ckpt3``."""
    return CELL_SEPARATOR.join((case_id, resume_mode, kill))


def cell_name(target: str, case_id: str, resume_mode: str, kill: str) -> str:
    """A cell's name: ``target[shuffle-auto-ckpt3]`` (the inverse of :func:`split_cell_name`)."""
    return f"{target}[{cell_id(case_id, resume_mode, kill)}]"


# -- reading -------------------------------------------------------------------------------------------

def parse_kill_id(text: str) -> tuple[KillSpec, ...]:
    """Inverse of :func:`kill_id` (also of the old spellings ``ckpt1,ckpt7+1`` and ``save3@4``); raises
    ValueError with the expected form."""
    # A fault's torn file may hold the separator, and a save fault is always alone.
    parts = ([text] if text.startswith(SAVE)
             else text.replace(OLD_KILL_SEPARATOR, KILL_SEPARATOR).split(KILL_SEPARATOR))
    return tuple(_parse_one(part.strip(), text) for part in parts)


def _parse_one(part: str, text: str) -> KillSpec:
    """One kill of the kill id ``text``."""
    if part.startswith(SAVE) and (OLD_OP in part or OP in part):
        match = _SAVE_KILL.match(part)
        if match is None:
            raise ValueError(f"kill point {text!r}: a fault looks like {SAVE}3{OP}4 (file operation 4 of the "
                             "save of step 3)")
        saved = int(match[1])
        return KillSpec(saved, 0, parse_fault_label(saved, match[2]))
    if not part.startswith(CKPT):
        raise ValueError(f"kill point {text!r}: each part must look like {CKPT}3 or {CKPT}3{UNSAVED}1, joined by "
                         f"{KILL_SEPARATOR!r}")
    point, *mods = part.split(SUFFIX)
    step, _, extra = point[len(CKPT):].partition(UNSAVED)
    return KillSpec(int(step), int(extra or 0), **_parse_kind(point, mods, text))


def _parse_kind(point: str, mods: Sequence[str], text: str) -> dict[str, Any]:
    """The distributed suffixes of one kill (``term5``, ``rank1``, ``ws2``, ``node1``, ``rejoin6``, ``agent``) as
    KillSpec fields."""
    out: dict[str, Any] = {}
    for mod in mods:
        m = _KIND_PART.fullmatch(mod)
        if m is None:
            raise ValueError(f"kill point {text!r}: unknown suffix {mod!r} of {point!r}; use {SUFFIX}{TERM}<grace "
                             f"seconds>, {SUFFIX}{RANK}<rank>, {SUFFIX}{WORLD}<world size>, {SUFFIX}{NODE}<node> (then "
                             f"{SUFFIX}{REJOIN}<step>) or {SUFFIX}{AGENT}")
        if m.group(1):
            out.update(signal=SIGNAL_TERM, grace=float(m.group(2)))
        elif m.group(3):
            out["rank"] = int(m.group(4))
        elif m.group(5):
            out["resume_world_size"] = int(m.group(6))
        elif m.group(7):
            out["node"] = int(m.group(8))
        elif m.group(9):
            out["agent"] = True
        else:
            out["rejoin"] = int(m.group(11))
    if "signal" in out and "rank" in out:
        raise ValueError(f"kill point {text!r}: {SUFFIX}{TERM} and {SUFFIX}{RANK} cannot be combined (SIGTERM goes "
                         "to every rank)")
    if "rejoin" in out and "node" not in out:
        raise ValueError(f"kill point {text!r}: only a lost node rejoins: {CKPT}4{SUFFIX}{NODE}1{SUFFIX}{REJOIN}6")
    return out


def parse_fault_label(step: int, text: str) -> FaultPlan:
    """Inverse of :func:`fault_label` for the save of ``step`` (the plan's ``total`` is not in the label);
    the old ``@4`` spelling too. Raises ValueError with the expected form."""
    text = text[len(OP):] if text.startswith(OP) else text.lstrip(OLD_OP)
    op, _, kind = text.partition(SUFFIX)
    rank = lane = None
    ranked = _RANK_PART.match(kind)
    if ranked is not None:
        rank, kind = int(ranked[1]), kind[ranked.end():].removeprefix(SUFFIX)
        threaded = _THREAD_PART.match(kind)
        if threaded is not None:
            lane, kind = int(threaded[1]), kind[threaded.end():].removeprefix(SUFFIX)
    torn = faults.MODE_TORN + SUFFIX
    if kind.startswith(torn):
        return FaultPlan(step, faults.MODE_TORN, int(op), file=kind[len(torn):], rank=rank, lane=lane)
    if kind in ("", faults.MODE_POWER, faults.MODE_RECORD):
        return FaultPlan(step, kind or faults.MODE_CRASH, int(op), rank=rank, lane=lane)
    node = _NODE_POWER.fullmatch(kind)
    if node is not None:
        return FaultPlan(step, faults.MODE_POWER, int(op), rank=rank, lane=lane, node=int(node[1]))
    errno = faults.ERRNOS.get(kind.rstrip(PERSISTENT))
    if errno is None:
        raise ValueError(f"fault {text!r} of the save of step {step}: unknown kind {kind!r}; use {OP}<N>, "
                         f"{OP}<N>{SUFFIX}{faults.MODE_POWER}[{SUFFIX}{NODE}<node>], {OP}<N>{SUFFIX}{torn}<file> or "
                         f"{OP}<N>{SUFFIX}<error>[{PERSISTENT}] with an error of {sorted(faults.ERRNOS)}")
    return FaultPlan(step, faults.MODE_ERROR, int(op), errno, kind.endswith(PERSISTENT), rank=rank, lane=lane)


def split_cell_name(name: str) -> tuple[str, str, str, str] | None:
    """``(target, case id, resume mode, kill id)`` of a cell's name, None if ``name`` is none."""
    match = _CELL_NAME.match(name)
    return None if match is None else (match["target"], match["case"], match["mode"], match["kill"])


def target_of(name: str) -> str:
    """The target a cell's name names (what comes before its ``[`` when the rest is no cell id)."""
    parts = split_cell_name(name)
    return parts[0] if parts is not None else name.partition("[")[0]
