"""A cell's record from a node made into the outcome its pytest item reports (:class:`CellOutcome`): a failing
cell's kept folders unpacked into this session's folder (entry by entry, within the copy limit:
:mod:`.evidence`), every path in its report and JSON pointing there, what was not copied back named on one
line (and in its JSON), a ``kept:`` line that would name folders gone with the node's group replaced by what
is true, and which variables the node's runs read with another value than here; the summary's line of how
many cells ran where."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from pytest_resume_check.cluster.connection import first_line, node_label
from pytest_resume_check.cluster.evidence import HERE, ON_NODE, THE_ARCHIVE, WHY_BROKEN, Refused, Unpacked, unpack
from pytest_resume_check.records.cell_json import CellJson
from pytest_resume_check.records.environ import differing

#: Added to a failing cell's report whose kept folders were too big to copy back.
MSG_LEFT_ON_NODE = ("  kept on node {node} (not copied back: {mb:.0f} MB, more than {opt}={limit:g}): {paths}")
#: The same, for kept folders the node could not pack (a fault of the harness there): they stay on the node.
MSG_NOT_PACKED = "  kept on node {node} (not copied back: packing them failed there: {why}): {paths}"
#: Added to a failing cell's report for the entries of its kept folders that were not copied back (one line:
#: the first :data:`NAMED` of them, then how many more the cell's JSON names under :data:`REFUSED_KEY`).
MSG_REFUSED = "  not copied back from node {node}: {entries}"
MSG_REFUSED_ENTRY = "{path} ({why}; {where})"
MSG_REFUSED_MORE = "; and {count} more (the cell's JSON names each, under {key})"
#: Where an entry was refused, as :data:`MSG_REFUSED_ENTRY` says it.
MSG_WHERE = {HERE: "refused here", ON_NODE: "left out on the node"}
NAMED = 3
#: In place of the ``kept:`` line of a cell none of whose kept folders could be unpacked here (the node
#: removed them with its group, so the line would name folders that no longer exist).
MSG_KEPT_NOTHING = ("  kept: nothing: the kept folders sent back by node {node} could not be unpacked here ({why}), "
                    "and the node removed them with its group")
#: Keys of a failing cell's JSON: the entries not copied back, the evidence sent back but not unpacked, the
#: evidence too big to copy that stayed on its node.
REFUSED_KEY: Final = "evidence_refused"
LOST_KEY: Final = "evidence_lost"
LEFT_KEY: Final = "kept_on_node"

#: The summary's line: how many cells ran where.
MSG_PLACES = "resume-check: {count} cell{s} ran on the Ray cluster at {address}: {places}"
MSG_PLACE = "{count} on node {node}"
#: Appended for the cells that had no outcome from any node (refused, lost, stopped): their lines say why.
MSG_NOWHERE = "{count} without one (refused or lost: each says why)"
#: Appended for the cells whose runs read variables that differ between this machine and their node.
MSG_DIFFERING = "; {count} read environment variables that differ there (see the warnings)"


@dataclass
class CellOutcome:
    """What a cell's item reports: ``kind`` as in :mod:`.wire`, the failure text or skip reason, the cell's
    JSON (paths pointing into this session's folder) and its reference runs' seconds."""

    kind: str
    text: str = ""
    cell_json: CellJson | None = None
    reference_seconds: float = 0.0
    #: A cell with no verdict: the category its JSON gets (``HARNESS``, ``TARGET_ERROR``).
    category: str | None = None
    #: The node the cell ran on (``node_id``, ``ip``, ``host``); empty: none (refused, lost, stopped).
    node: dict[str, str] = field(default_factory=dict)
    #: Variables its runs read that differ between this machine and the node (names, sorted).
    differs: list[str] = field(default_factory=list)


@dataclass
class Receiving:
    """Where a session receives its cells' records: its folder, the copy limit (and the option that sets it),
    the key of the variables' digests."""

    root: Path
    copy_bytes: int
    copy_option: str
    env_key: str
    #: Two groups of one case bring the same reference folder: one unpacks at a time.
    unpacking: threading.Lock = field(default_factory=threading.Lock)


def node_name(node: Mapping[str, str]) -> str:
    """A task's node as a report names it, or that it is not known yet."""
    return node_label(node) if node else "(not known yet)"


def outcome_of(record: dict[str, Any], node: dict[str, str], env: Mapping[str, str | None],
               here: Receiving) -> CellOutcome:
    """A cell's record (from the task on ``node``, whose runs got ``env`` from here) as its item reports it:
    evidence unpacked here, its paths pointing here, what was not copied back named (and the ``kept:`` line
    true when nothing was)."""
    remote_root = str(record.get("root") or "")
    text = str(record.get("text") or "")
    cell_json: CellJson | None = record.get("cell_json")
    refused = [Refused.from_json(r) for r in record.get("evidence_refused") or ()]
    if record.get("evidence") is not None and remote_root:
        unpacked = _unpack(record["evidence"], remote_root, record.get("kept") or [], here)
        if unpacked.placed:
            text = text.replace(remote_root, str(here.root))
            cell_json = _replaced(cell_json, remote_root, str(here.root))
        else:
            why = unpacked.refused[-1].why if unpacked.refused else "the archive held nothing"
            nothing = MSG_KEPT_NOTHING.format(node=node_name(node), why=why)
            kept_line = str(record.get("kept_line") or "")
            text = text.replace(kept_line, nothing) if kept_line and kept_line in text else f"{text}\n{nothing}"
            if cell_json is not None:
                cell_json[LOST_KEY] = {"node": node, "paths": list(record.get("kept") or ()), "why": why}
        # The archive as a whole, when nothing of it could be placed, is named by the kept line alone.
        refused += [r for r in unpacked.refused if unpacked.placed or r.path != THE_ARCHIVE]
    if refused:
        text += "\n" + refused_line(refused, node, here.root)
        if cell_json is not None:
            cell_json[REFUSED_KEY] = [{**r.to_json(), "path": _here(r.path, here.root)} for r in refused]
    left = record.get("evidence_left")
    if left:
        paths, name = ", ".join(left["paths"]), node_name(node)
        text += "\n" + (MSG_NOT_PACKED.format(node=name, why=left["why"], paths=paths) if left.get("why")
                        else MSG_LEFT_ON_NODE.format(node=name, mb=left["bytes"] / 2**20, opt=here.copy_option,
                                                     limit=here.copy_bytes / 2**20, paths=paths))
        if cell_json is not None:
            cell_json[LEFT_KEY] = {"node": node, **left}
    # What the node's runs read, compared here without values; the variables the task set are equal.
    differs = differing(record.get("environ") or {}, here.env_key, os.environ, env)
    return CellOutcome(record["outcome"], text, cell_json, float(record.get("reference_seconds") or 0.0),
                       node=dict(node), differs=differs)


def placement(outcomes: Sequence[CellOutcome], address: str) -> str | None:
    """The summary's line: how many of ``outcomes`` came from each node of the cluster at ``address`` (None
    before any cell had an outcome)."""
    if not outcomes:
        return None
    counts: dict[str, int] = {}
    for got in outcomes:
        if got.node:
            counts[node_label(got.node)] = counts.get(node_label(got.node), 0) + 1
    places = [MSG_PLACE.format(count=n, node=node) for node, n in sorted(counts.items(), key=lambda x: -x[1])]
    nowhere = len(outcomes) - sum(counts.values())
    if nowhere:
        places.append(MSG_NOWHERE.format(count=nowhere))
    line = MSG_PLACES.format(count=len(outcomes), s="" if len(outcomes) == 1 else "s", address=address,
                             places=", ".join(places))
    differ = sum(1 for got in outcomes if got.differs)
    return line + (MSG_DIFFERING.format(count=differ) if differ else "")


def refused_line(refused: Sequence[Refused], node: Mapping[str, str], root: Path) -> str:
    """The report's line naming the entries of a cell's kept folders that were not copied back."""
    entries = "; ".join(MSG_REFUSED_ENTRY.format(path=_here(r.path, root), why=r.why, where=MSG_WHERE[r.where])
                        for r in refused[:NAMED])
    if len(refused) > NAMED:
        entries += MSG_REFUSED_MORE.format(count=len(refused) - NAMED, key=REFUSED_KEY)
    return MSG_REFUSED.format(node=node_name(node), entries=entries)


def _here(path: str, root: Path) -> str:
    """Where an entry of the archive (a path relative to the session's folder) lies, or would, here."""
    return path if path == THE_ARCHIVE else str(root / path)


def _unpack(data: bytes, remote_root: str, kept: Sequence[str], here: Receiving) -> Unpacked:
    """Unpack kept folders into this session's folder (:func:`~.evidence.unpack`: entry by entry, each
    inside one of the cell's kept folders, within the copy limit)."""
    folders = []
    for path in kept:
        try:
            folders.append(str(Path(path).relative_to(remote_root)))
        except ValueError:
            continue
    try:
        with here.unpacking:  # two groups of one case bring the same reference folder
            return unpack(data, here.root, folders, here.copy_bytes)
    except Exception as exc:  # a fault of the harness here: named in the cell's report, the rest goes on
        return Unpacked(0, [Refused(THE_ARCHIVE, WHY_BROKEN.format(error=first_line(exc)), HERE)])


_Json = TypeVar("_Json")


def _replaced(value: _Json, old: str, new: str) -> _Json:
    """``value`` (JSON data) with ``old`` replaced by ``new`` in every string."""
    replaced: Any = value
    if isinstance(value, str):
        replaced = value.replace(old, new)
    elif isinstance(value, list):
        replaced = [_replaced(v, old, new) for v in value]
    elif isinstance(value, dict):
        replaced = {k: _replaced(v, old, new) for k, v in value.items()}
    return replaced
