"""The kill-id grammar, the one place that writes and reads it: ``ckpt3``, ``ckpt3+1:term5``,
``ckpt2_ckpt5``, ``save3op4:power``, and a cell's name ``target[case-mode-kill]``.

Everything else reads a cell's structured kills (:meth:`KillSpec.to_json`), never the string.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_resume_check.records import faults
from pytest_resume_check.records.plan import RESUME_AUTO, RESUME_PATH, SIGNAL_TERM, KillSpec

#: A kill right after a checkpoint, and a fault inside a save: the two words a kill id starts with.
CKPT = "ckpt"
SAVE = "save"
#: The resume modes a cell is run in (a cell's name carries one).
CELL_RESUME_MODES = (RESUME_AUTO, RESUME_PATH)

#: Between the kills of a cell killed twice: ``ckpt1_ckpt7+1``.
KILL_SEPARATOR = "_"


def kill_id(kills: Sequence[KillSpec]) -> str:
    """``ckpt3`` (killed right after checkpoint 3), ``ckpt3+1`` (one unsaved step later),
    ``ckpt2_ckpt5`` (killed twice), ``save3op4:power`` (a fault in the save of step 3); distributed
    kinds add ``:rank1`` (rank 1 alone killed), ``:term5`` (SIGTERM, SIGKILL 5 s later), ``:ws1``
    (resumed with 1 rank)."""
    return KILL_SEPARATOR.join(
        f"{SAVE}{k.checkpoint_step}{k.fault.label}" if k.fault is not None
        else f"{CKPT}{k.checkpoint_step}" + (f"+{k.extra_steps}" if k.extra_steps else "") + _kind_suffix(k)
        for k in kills
    )


def _kind_suffix(k: KillSpec) -> str:
    return ((f":term{k.grace:g}" if k.signal == SIGNAL_TERM else "") + (f":rank{k.rank}" if k.rank is not None else "")
            + (f":ws{k.resume_world_size}" if k.resume_world_size is not None else ""))


def _parse_kind(point: str, mods: Sequence[str], text: str) -> dict[str, Any]:
    """The distributed suffixes of one kill (``term5``, ``rank1``, ``ws2``) as KillSpec fields."""
    out: dict[str, Any] = {}
    for mod in mods:
        m = re.fullmatch(r"(term)(\d+(?:\.\d+)?)|(rank)(\d+)|(ws)(\d+)", mod)
        if m is None:
            raise ValueError(f"kill point {text!r}: unknown suffix {mod!r} of {point!r}; use :term<grace seconds>, "
                             ":rank<rank> or :ws<world size>")
        if m.group(1):
            out.update(signal=SIGNAL_TERM, grace=float(m.group(2)))
        elif m.group(3):
            out["rank"] = int(m.group(4))
        else:
            out["resume_world_size"] = int(m.group(6))
    if "signal" in out and "rank" in out:
        raise ValueError(f"kill point {text!r}: :term and :rank cannot be combined (SIGTERM goes to every rank)")
    return out


def parse_kill_id(text: str) -> tuple[KillSpec, ...]:
    """Inverse of :func:`kill_id` (also of the old spellings ``ckpt1,ckpt7+1`` and ``save3@4``); raises
    ValueError with the expected form."""
    kills = []
    parts = [text] if text.startswith(SAVE) else text.replace(",", KILL_SEPARATOR).split(KILL_SEPARATOR)
    for part in parts:
        part = part.strip()
        if part.startswith(SAVE) and ("@" in part or "op" in part):
            step, label = re.match(r"save(\d+)(.*)$", part).groups()
            kills.append(KillSpec(int(step), 0, faults.parse_label(int(step), label)))
            continue
        if not part.startswith(CKPT):
            raise ValueError(f"kill point {text!r}: each part must look like ckpt3 or ckpt3+1, joined by "
                             f"{KILL_SEPARATOR!r}")
        point, *mods = part.split(":")
        step, _, extra = point[len(CKPT):].partition("+")
        kills.append(KillSpec(int(step), int(extra or 0), **_parse_kind(point, mods, text)))
    return tuple(kills)


#: A cell's name: ``target[case-mode-kill]`` (the case id may hold dashes; the kill id starts with ckpt or save).
_CELL_NAME = re.compile(r"^(?P<target>[^\[]+)\[(?P<case>.*)-(?P<mode>" + "|".join(CELL_RESUME_MODES)
                        + r")-(?P<kill>(?:" + f"{CKPT}|{SAVE}" + r")[^\]]*)\]$")


def split_cell_name(name: str) -> tuple[str, str, str, str] | None:
    """``(target, case id, resume mode, kill id)`` of a cell's name, None if ``name`` is none."""
    match = _CELL_NAME.match(name)
    return None if match is None else (match["target"], match["case"], match["mode"], match["kill"])
