"""Commit points of zero-change programs: the pointer or tracker file a program writes once a checkpoint is
complete, and the checkpoint it names.

Many trainers make a checkpoint selectable by writing a small file that names it after the checkpoint itself
(DeepSpeed's ``latest`` holds the tag of the newest folder, Megatron-LM's ``latest_checkpointed_iteration.txt``
and verl's ``latest_checkpointed_iteration.txt`` the step number), and resume from what that file names. Such a
program's checkpoint is published when the pointer names it, not when the checkpoint's own file gets its name.

Plain functions of paths relative to the checkpoint folder (stdlib only): :func:`named_checkpoint` reads what a
pointer names (in the program, :mod:`pytest_resume_check.child.watch`), :func:`recognised_commit` tells which
file of an uninterrupted run is its commit point when the target declares none (the reference,
:mod:`pytest_resume_check.cells.references`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Collection, Sequence

#: The most bytes of a file read as a pointer: pointers hold a name or a number, and a bigger file is none.
MAX_POINTER_BYTES = 4096

_GLOB_CHARS = re.compile(r"[*?\[]")


def matches(rel: str, pattern: str) -> bool:
    """Whether the relative path ``rel`` matches the glob ``pattern`` part by part (``*`` never spans a
    folder: ``ckpt_*`` matches ``ckpt_3``, not the files inside it)."""
    parts, wanted = rel.split(os.sep), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted))


def holding(rel: str, pattern: str) -> str | None:
    """The checkpoint (matching ``pattern``) that ``rel`` is or lies in (a file of a checkpoint folder), None if
    none."""
    parts = rel.split(os.sep)
    for end in range(len(parts), 0, -1):
        head = os.sep.join(parts[:end])
        if matches(head, pattern):
            return head
    return None


def pointer_text(raw: bytes) -> str | None:
    """What a pointer file holds: its first line, stripped; None for bytes that are no short text."""
    if len(raw) > MAX_POINTER_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines and "\x00" not in text else None


def named_checkpoint(text: str, pointer: str, pattern: str, known: Sequence[str], root: str) -> str | None:
    """The checkpoint (relative to the checkpoint folder ``root``) that a pointer's ``text`` names, None if it
    names none. ``pointer``: the pointer file (relative to ``root``); ``known``: the checkpoints there are, oldest
    first. In this order, ``text`` is:

    - a path of a checkpoint or of a file in one: absolute (inside ``root``), or relative to the pointer's folder
      or to ``root`` (it need not exist: a pointer written before its checkpoint names it all the same);
    - a checkpoint's name (the last part of one of ``known``, DeepSpeed's tag);
    - a step number (Megatron-LM's and verl's trackers): the newest of ``known`` whose name's last number it is,
      else ``pattern`` with the number for its one ``*``.
    """
    if os.path.isabs(text):
        inside = os.path.relpath(os.path.normpath(text), root)
        paths = [] if inside.startswith(os.pardir) else [inside]
    else:
        paths = [os.path.normpath(os.path.join(os.path.dirname(pointer), text)), os.path.normpath(text)]
    for path in paths:
        found = holding(path, pattern) if not path.startswith(os.pardir) else None
        if found is not None:
            return found
    for checkpoint in reversed(known):
        if os.path.basename(checkpoint) == text:
            return checkpoint
    if not text.isdigit():
        return None
    for checkpoint in reversed(known):
        numbers = re.findall(r"\d+", os.path.basename(checkpoint))
        if numbers and int(numbers[-1]) == int(text):
            return checkpoint
    if len(_GLOB_CHARS.findall(pattern)) == 1 and "*" in pattern:
        return os.path.normpath(pattern.replace("*", text))
    return None


def recognised_commit(published: Sequence[str], pointers: Sequence[tuple[str, str]],
                      filled: Collection[str]) -> str | None:
    """The commit point of an uninterrupted run that declares none, None if it has none: the file whose every
    write named a checkpoint the run made and that named each checkpoint the run published. ``published``: the
    checkpoints that got their final name, in order; ``pointers``: (file, checkpoint it named) for each small
    file that got its final name naming one; ``filled``: checkpoint folders filled in place (never published
    themselves, so only a pointer can commit them). Of several such files the one naming the most checkpoints;
    a tie: None (the run alone cannot tell them apart)."""
    made = set(published) | set(filled)
    named: dict[str, list[str]] = {}
    for file, checkpoint in pointers:
        named.setdefault(file, []).append(checkpoint)
    fits = {file: set(names) for file, names in named.items()
            if set(names) <= made and set(published) <= set(names)}
    if not fits:
        return None
    most = max(len(names) for names in fits.values())
    best = [file for file, names in fits.items() if len(names) == most]
    return best[0] if len(best) == 1 else None
