"""A failing cell as a folder that reproduces it alone (``--resume-matrix-repro=DIR``): the files that
declare its target, a ``pytest.ini`` that makes the folder its own root, and a ``README.md`` with the
headline, the excerpt and the one command that runs exactly this cell again.

The plugin decides what to copy and the command (it knows the conftests and the options); this module
names the folder, writes the texts and the files. It never deletes: a folder of an earlier session is
written over file by file.

A folder is uploaded and shared (a CI artifact, an attachment to a bug report), so it holds only the
project's own files and no path of the machine it was written on: each copy is read inside the project's
root (a regular file, a link followed only while it stays inside), the README names copies by their path
relative to that root, a module from outside it by its name alone, and the failure report's paths (a
traceback, the kept folders) with the machine's places named (:func:`without_machine_paths`).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from pytest_resume_check.records.names import OPT_ENV, OPT_REPRO, OPT_TARGET
from pytest_resume_check.records.regular_files import NotRegular, kind_of, open_inside, read_chunks

#: Keys of a failing cell's JSON: the folder of its reproduction, or why it could not be written.
CELL_KEY: Final = "repro"
CELL_ERROR_KEY: Final = "repro_error"
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
#: ``{source}``: the copied file's path relative to the project's root.
COPIED = "- `{dest}`: a copy of the project's `{source}`"
DECLARED_IN = "- `conftest.py`: a copy of the project's `{source}`, which declares the target `{target}`"
#: A conftest outside the project's root declares the target: not copied (it may hold what is not the project's).
DECLARED_OUTSIDE = ("- no copy of the target's conftest: `{target}` is declared by the conftest `{module}` from "
                    "outside the project (needed, not copied); put a copy of it here as `conftest.py`")
#: A module the target uses that lies outside the project's root (a ``sys.path`` entry elsewhere): never
#: copied, and named without its path, which is the machine's.
NEEDED_OUTSIDE = "- needed, not copied: {name} (from outside the project)"
#: A file chosen for copying that is no regular file inside the project's root when it is read.
REFUSED = "- not copied: `{source}` is {kind}"
INSTALLED = ("- no copy of the target: `{target}` is not declared by a conftest.py of the project; it comes from "
             "an installed package (an entry point of group `pytest_resume_check.targets`) or a plugin, which "
             f"`{OPT_TARGET}={{target}}` in the command finds where it is installed")
NOT_COPIED = "- not copied: {what}"
INI_LINE = ("- `pytest.ini`: makes this folder pytest's root (the project's own ini and conftests are not read) "
            "and puts it on `sys.path`")
ENV_TITLE = "## Its environment"
ENV_PASSED = ("The target's runs take these variables from the environment pytest runs in (`pass_env=`, "
              f"`{OPT_ENV}`); where the cell failed they were as below. Set them so before the command:")
ENV_SET_BY_TARGET = ("Set on every run by the target's `env=` in `conftest.py` (the command sets them again): "
                     "{pairs}.")
ENV_READ = ("The runs also read these variables, which are not declared, so their values were not recorded: "
            "{names}. Set them as they were where the cell failed, or declare them (`pass_env=` on the target, or "
            f"`{OPT_ENV}`) to have their values recorded here.")
ENV_HARNESS = "The harness set these for each run itself, and sets them again when the command runs: {names}."
ENV_NONE = ("The runs read no environment variable of the project's own code, and none is declared for the "
            "target.")
INI_TEXT = ("[pytest]\n"
            f"# Written by pytest-resume-check ({OPT_REPRO}): this folder is its own root, and the\n"
            "# modules copied beside conftest.py import from it.\n"
            "pythonpath = .\n")


@dataclass(frozen=True)
class Environment:
    """The environment a failing cell's runs had, as far as it is known (values only of declared variables)."""

    #: Declared variables taken from the session's environment, with their values (None: unset).
    passed: Mapping[str, str | None] = field(default_factory=dict)
    #: What a command target's ``env=`` sets on every run.
    set_by_target: Mapping[str, str] = field(default_factory=dict)
    #: Other variables the project's code read in the runs (names only).
    read: Sequence[str] = ()
    #: Variables the harness set for the runs (names only).
    harness: Sequence[str] = ()


def environment_lines(env: Environment) -> list[str]:
    """The README's section on the runs' environment: how to set the declared variables, then the names of
    the others."""
    lines = [ENV_TITLE, ""]
    if env.passed:
        sets = [f"export {name}={shlex.quote(value)}" if value is not None else f"unset {name}"
                for name, value in env.passed.items()]
        lines += [ENV_PASSED, "", *fenced(sets, "bash"), ""]
    if env.set_by_target:
        pairs = ", ".join(f"`{name}={value}`" for name, value in env.set_by_target.items())
        lines += [ENV_SET_BY_TARGET.format(pairs=pairs), ""]
    if env.read:
        lines += [ENV_READ.format(names=", ".join(f"`{name}`" for name in env.read)), ""]
    if not (env.passed or env.set_by_target or env.read):
        lines += [ENV_NONE, ""]
    if env.harness:
        lines += [ENV_HARNESS.format(names=", ".join(f"`{name}`" for name in env.harness)), ""]
    return lines


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
    #: The project's root (pytest's rootdir): every copy is read inside it.
    root: Path | None = None
    #: Where the copied files go in the folder (``conftest.py``, ``pkg/mod.py``) and where they come from,
    #: relative to ``root``.
    copies: Mapping[str, Path] = field(default_factory=dict)
    #: The conftest that declares the target (copied as ``conftest.py``), relative to ``root``; None: an
    #: installed package's, or one outside the project (``declared_outside``).
    declared_in: Path | None = None
    #: The module name of a conftest outside the project that declares the target (not copied).
    declared_outside: str | None = None
    #: Modules the target uses that lie outside the project's root, by name (not copied).
    outside: Sequence[str] = ()
    #: What a reproduction needs but could not take along, each said in a few words.
    not_copied: Sequence[str] = ()
    #: Files chosen for copying that were no regular file inside ``root`` when read: path (relative to
    #: ``root``) and what it was instead (set by :func:`write`).
    refused: Mapping[str, str] = field(default_factory=dict)
    #: Absolute paths of this machine and what the README writes in their place (the project's root: ``""``,
    #: paths relative to it); see :func:`without_machine_paths`.
    places: Mapping[str, str] = field(default_factory=dict)
    #: ``key = value`` lines added to ``pytest.ini`` (the project's ini settings the cell depends on).
    ini: Mapping[str, str] = field(default_factory=dict)
    #: ``name version`` of the packages a rerun needs.
    versions: Sequence[str] = ()
    plugin_version: str = "?"
    #: The environment its runs had.
    environment: Environment = field(default_factory=Environment)


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
    """The README of a reproduction folder. What the session wrote (the headline, the excerpt, the report,
    the notes) is written with the machine's paths named (:func:`without_machine_paths`); the command and the
    declared variables' values are written as they are."""
    def own(text: str) -> str:
        return without_machine_paths(text, repro.places)

    lines = [README_TITLE.format(name=repro.name), "",
             *fenced([own(repro.headline), *map(own, repro.excerpt)], "text"), "",
             RUN_TITLE, "", RUN_TEXT.format(version=repro.plugin_version), "", *fenced([repro.command], "bash"), ""]
    if repro.versions:
        lines += [VERSIONS.format(versions=", ".join(repro.versions)), ""]
    lines += environment_lines(repro.environment)
    lines += [FILES_TITLE, ""]
    if repro.declared_in is not None:
        lines.append(DECLARED_IN.format(source=repro.declared_in.as_posix(), target=repro.target))
    elif repro.declared_outside is not None:
        lines.append(DECLARED_OUTSIDE.format(target=repro.target, module=repro.declared_outside))
    else:
        lines.append(INSTALLED.format(target=repro.target))
    lines += [COPIED.format(dest=dest, source=source.as_posix()) for dest, source in repro.copies.items()
              if dest != "conftest.py"]
    lines.append(INI_LINE)
    lines += [NEEDED_OUTSIDE.format(name=name) for name in repro.outside]
    lines += [NOT_COPIED.format(what=own(what)) for what in repro.not_copied]
    lines += [REFUSED.format(source=source, kind=own(kind)) for source, kind in repro.refused.items()]
    lines += ["", ORIGINAL_TITLE, "", *fenced(own(repro.report).splitlines(), "text"), ""]
    return "\n".join(lines)


def without_machine_paths(text: str, places: Mapping[str, str]) -> str:
    """``text`` with each of the absolute paths ``places`` names replaced by its name (the longest first, so
    a folder inside another is named as itself): a path below a place becomes ``name/rest``, and below the
    place named ``""`` (the project's root) plain ``rest``, relative to it. A place matches only as whole path
    components: ``/p`` is not replaced in ``/p2`` nor in ``/x/p``."""
    order = sorted((p for p in places if p), key=len, reverse=True)
    if not order:
        return text
    pattern = re.compile(r"(?<![\w./~-])(" + "|".join(map(re.escape, order)) + r")(?:(/)|(?![\w.-]))")

    def named(match: re.Match[str]) -> str:
        name = places[match.group(1)]
        if match.group(2):
            return f"{name}/" if name else ""
        return name or "."

    return pattern.sub(named, text)


def ini_text(repro: Repro) -> str:
    """The folder's ``pytest.ini``."""
    return INI_TEXT + "".join(f"{key} = {value}\n" for key, value in repro.ini.items())


def write(folder: Path, repro: Repro) -> Path:
    """Write the reproduction into ``folder`` (made if missing); its path. Each copy is read inside
    ``repro.root`` as a regular file (a link followed only while it stays inside, up to the size the file
    has when opened); one that is something else is left out, and the README names it."""
    folder.mkdir(parents=True, exist_ok=True)
    refused: dict[str, str] = {}
    for dest, source in repro.copies.items():
        kind = _copy_inside(repro.root, source, folder / dest)
        if kind is not None:
            refused[dest] = kind
    if refused:
        repro = replace(repro, copies={d: s for d, s in repro.copies.items() if d not in refused},
                        refused={repro.copies[d].as_posix(): kind for d, kind in refused.items()})
    (folder / INI).write_text(ini_text(repro), encoding="utf-8")
    (folder / README).write_text(readme_text(repro), encoding="utf-8")
    return folder


def _copy_inside(root: Path | None, source: Path, target: Path) -> str | None:
    """Copy ``source`` (relative to ``root``) to ``target``: None, or what ``source`` is instead of a regular
    file inside ``root`` (then nothing is written)."""
    if root is None:
        raise ValueError(f"{source}: a copy needs the project's root to read it from")
    try:
        fd = open_inside(str(root), source.as_posix())
    except NotRegular as exc:  # replaced since the plugin chose it
        return exc.kind
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # a folder by now
            return kind_of(mode)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            for chunk in read_chunks(fd):
                out.write(chunk)
    finally:
        os.close(fd)
    return None


def fenced(lines: Sequence[str], language: str) -> list[str]:
    """``lines`` in a fenced block whose fence is longer than any backtick run inside it (a log line may
    hold one)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, *lines, fence]
