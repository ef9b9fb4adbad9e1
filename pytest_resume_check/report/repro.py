"""A failing cell as a folder that reproduces it alone (``--resume-matrix-repro=DIR``): the files that
declare its target, a ``pytest.ini`` that makes the folder its own root, and a ``README.md`` with the
headline, the excerpt and the one command that runs exactly this cell again.

The plugin decides what to copy and the command (it knows the conftests and the options); this module
names the folder, writes the texts and the files. It never deletes: a folder of an earlier session is
written over file by file.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Keys of a failing cell's JSON: the folder of its reproduction, or why it could not be written.
CELL_KEY = "repro"
CELL_ERROR_KEY = "repro_error"
#: A folder name is at most this long (file systems take 255 bytes; the rest is left for suffixes).
NAME_CHARS = 120
#: The file in each folder that names its cell (so a second cell whose name makes the same folder name
#: gets another folder).
README = "README.md"
INI = "pytest.ini"
#: The first line of a README: the cell it reproduces.
README_TITLE = "# Reproduction of the resume-matrix cell `{name}`"
RUN_TITLE = "## Run it"
FILES_TITLE = "## What is here"
ORIGINAL_TITLE = "## The run it came from"
RUN_TEXT = ("In this folder, with pytest-resume-check {version} installed (and what the target imports), this "
            "command runs exactly this cell, with the seed, mode and options it failed with, and fails with the "
            "headline above:")
VERSIONS = "Where it failed: {versions}."
COPIED = "- `{dest}`: a copy of `{source}`"
DECLARED_IN = "- `conftest.py`: a copy of `{source}`, which declares the target `{target}`"
INSTALLED = ("- no copy of the target: `{target}` is not declared by a conftest.py of the project; it comes from "
             "an installed package (an entry point of group `pytest_resume_check.targets`) or a plugin, which "
             "`--resume-matrix-target={target}` in the command finds where it is installed")
NOT_COPIED = "- not copied: {what}"
INI_LINE = ("- `pytest.ini`: makes this folder pytest's root (the project's own ini and conftests are not read) "
            "and puts it on `sys.path`")
INI_TEXT = ("[pytest]\n"
            "# Written by pytest-resume-check (--resume-matrix-repro): this folder is its own root, and the\n"
            "# modules copied beside conftest.py import from it.\n"
            "pythonpath = .\n")


@dataclass(frozen=True)
class Repro:
    """What a reproduction folder holds."""

    #: The cell's name, ``target[case-mode-kill]``.
    name: str
    target: str
    headline: str
    #: The failure text's excerpt: two aligned lines around where the ledger the first finding is about parts
    #: (under a line naming that ledger when it is not the plain consumed one; none when the ledgers agree).
    excerpt: Sequence[str]
    #: The one-line command, run in the folder.
    command: str
    #: The whole failure report of the session it came from (with its rerun line and kept folders).
    report: str
    #: Where the copied files go in the folder (``conftest.py``, ``pkg/mod.py``) and where they come from.
    copies: Mapping[str, Path] = field(default_factory=dict)
    #: The conftest that declares the target (copied as ``conftest.py``); None: an installed package's.
    declared_in: Path | None = None
    #: What a reproduction needs but could not take along, each said in a few words.
    not_copied: Sequence[str] = ()
    #: ``key = value`` lines added to ``pytest.ini`` (the project's ini settings the cell depends on).
    ini: Mapping[str, str] = field(default_factory=dict)
    #: ``name version`` of the packages a rerun needs.
    versions: Sequence[str] = ()
    plugin_version: str = "?"


def folder_name(cell_name: str) -> str:
    """A file name for a cell's folder: ``target[case-mode-kill]`` as ``target-case-mode-kill``, any
    character outside letters, digits and ``._+-`` made ``_`` (``:`` of ``ckpt5+1:term2`` too), and a
    leading ``.`` or ``-``, cut to :data:`NAME_CHARS`."""
    name = cell_name.replace("[", "-", 1)
    name = name[:-1] if name.endswith("]") else name
    name = re.sub(r"^[.-]", "_", re.sub(r"[^A-Za-z0-9._+-]", "_", name)) or "cell"  # no "..", no option
    return name[:NAME_CHARS]


def folder_for(root: Path, cell_name: str) -> Path:
    """The folder of ``cell_name`` under ``root``: :func:`folder_name`, or with ``-2``, ``-3``, ... when
    a folder of that name already reproduces another cell."""
    base = folder_name(cell_name)
    for n in range(1, 1000):
        folder = root / (base if n == 1 else f"{base}-{n}")
        readme = folder / README
        if not readme.exists() or _cell_of(readme) == cell_name:
            return folder
    raise FileExistsError(f"{root / base}: a thousand folders of that name reproduce other cells")


def _cell_of(readme: Path) -> str | None:
    """The cell a README reproduces (its first line), None if it is not one of ours."""
    try:
        first = readme.read_text(encoding="utf-8").split("\n", 1)[0]
    except (OSError, UnicodeDecodeError):
        return None
    prefix, _, rest = README_TITLE.partition("{name}")
    if first.startswith(prefix) and first.endswith(rest):
        return first[len(prefix):len(first) - len(rest)]
    return None


def readme_text(repro: Repro) -> str:
    """The README of a reproduction folder."""
    lines = [README_TITLE.format(name=repro.name), "", *fenced([repro.headline, *repro.excerpt], "text"), "",
             RUN_TITLE, "", RUN_TEXT.format(version=repro.plugin_version), "", *fenced([repro.command], "bash"), ""]
    if repro.versions:
        lines += [VERSIONS.format(versions=", ".join(repro.versions)), ""]
    lines += [FILES_TITLE, ""]
    if repro.declared_in is not None:
        lines.append(DECLARED_IN.format(source=repro.declared_in, target=repro.target))
    else:
        lines.append(INSTALLED.format(target=repro.target))
    lines += [COPIED.format(dest=dest, source=source) for dest, source in repro.copies.items() if dest != "conftest.py"]
    lines.append(INI_LINE)
    lines += [NOT_COPIED.format(what=what) for what in repro.not_copied]
    lines += ["", ORIGINAL_TITLE, "", *fenced(repro.report.splitlines(), "text"), ""]
    return "\n".join(lines)


def ini_text(repro: Repro) -> str:
    """The folder's ``pytest.ini``."""
    return INI_TEXT + "".join(f"{key} = {value}\n" for key, value in repro.ini.items())


def write(folder: Path, repro: Repro) -> Path:
    """Write the reproduction into ``folder`` (made if missing); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    for dest, source in repro.copies.items():
        target = folder / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    (folder / INI).write_text(ini_text(repro), encoding="utf-8")
    (folder / README).write_text(readme_text(repro), encoding="utf-8")
    return folder


def fenced(lines: Sequence[str], language: str) -> list[str]:
    """``lines`` in a fenced block whose fence is longer than any backtick run inside it (a log line may
    hold one)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, *lines, fence]
