"""``--resume-matrix-repro=DIR``: each failing cell written as a folder that reproduces it alone.

Written by the process that ran the cell (an xdist worker too: it collected the targets and loaded the
conftests), right after the cell, so a session stopped later keeps the folders of the cells that failed
before. What the folder holds is decided here, where the conftests are known:

- a target declared in a conftest.py: a copy of that conftest, and of the project's own modules it and
  the target use (the target function's module, its ``preload`` modules, what those import), each at its
  import path, so ``import project_trainer`` finds the copy; modules of installed distributions and of
  the standard library are not copied, the README names their versions;
- a target of an installed package (an entry point) or a plugin: nothing to copy; the command names it
  with ``--resume-matrix-target``.

Only files under the project's root (pytest's rootdir) are copied: a module the conftest imports from a
folder elsewhere (a ``sys.path`` entry outside the project, such as a machine's settings holding a token)
is named in the README by its module name, never copied, and a folder is what a CI job uploads. The
README names no path of the machine either. Which modules and which places is :mod:`.project_files`'s
(:func:`~.project_files.project_modules`, :func:`~.project_files.machine_places`).

The command is the cell's rerun command without the session's paths (:func:`.commands.repro_command`).
The README also says how to set the runs' environment: the declared variables with their values here,
the others by name only (:func:`.environment.for_repro`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_resume_check.plugin import environment
from pytest_resume_check.plugin.commands import repro_command
from pytest_resume_check.plugin.project_files import (
    PLUGIN_DISTRIBUTION,
    ProjectModules,
    inside_root,
    machine_places,
    project_modules,
)
from pytest_resume_check.plugin.settings import SETTINGS_KEY
from pytest_resume_check.records.names import OPT_REPRO

ERR_REPRO_WRITE = ("resume matrix: cannot write the reproduction of {name} to {path}: {reason}; choose a writable "
                   "folder with " + OPT_REPRO)
#: Versions a README names, when installed (looked up, never imported).
VERSIONS_OF = ("pytest", "torch", "torchdata", "numpy", "lightning", "transformers", "accelerate", "verl")
HOOKS = ("pytest_resume_check_cases", "pytest_resume_check_targets")
#: ``{where}``: the conftest's path relative to the project's root, or :data:`OUTSIDE_CONFTEST`.
NOTE_HOOKS = ("{where}, which implements {hooks}: a cell of other cases may be missing without it (copy those "
              "hooks into conftest.py)")
OUTSIDE_CONFTEST = "the conftest `{module}` from outside the project"
NOTE_PACKAGE_CONFTEST = ("`{path}` is imported as `{module}` (a conftest inside a package): its relative imports "
                         "do not work as the top-level conftest.py here")


def write_cell(config: pytest.Config, item: Any) -> None:
    """Write the reproduction of the cell ``item`` if it fails and ``--resume-matrix-repro`` is given; its
    folder goes into the cell's JSON (``repro``). A folder that cannot be written never fails the cell or
    the session: the JSON says why (``repro_error``) and the controller's summary shows it."""
    from pytest_resume_check import categories

    settings = config.stash[SETTINGS_KEY]
    cell_json = item.cell_json
    if not settings.repro_dir or cell_json is None or not categories.fails(cell_json):
        return
    from pytest_resume_check.report import repro as folder_of

    root = Path(os.path.abspath(Path(config.invocation_params.dir, settings.repro_dir)))
    try:
        folder = folder_of.write(folder_of.folder_for(root, item.name), describe(config, item))
    except Exception as exc:  # a full disk, a file where the folder should be, or our own bug: said, not fatal
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        cell_json[folder_of.CELL_ERROR_KEY] = ERR_REPRO_WRITE.format(name=item.name, path=root, reason=reason)
        return
    cell_json[folder_of.CELL_KEY] = str(folder)


def describe(config: pytest.Config, item: Any) -> Any:
    """The :class:`~pytest_resume_check.report.repro.Repro` of the failing cell ``item``."""
    from pytest_resume_check import categories
    from pytest_resume_check.report import repro, text

    target = item.cell.target
    result = item.result
    cell_json = item.cell_json
    rerun = cell_json.get("rerun")
    headline = categories.headline(cell_json)
    excerpt: list[str] = []
    report = "\n".join([headline, f"  rerun: {rerun}"] if rerun else [headline])
    if result is not None and not result.passed:  # (an expected failure that passed has no failure text)
        excerpt = text.evidence_lines(result.verdict)
        report = text.failure_text(result, rerun)
    elif getattr(item, "failure_text", None):  # run on a cluster node: its report came back whole
        report = item.failure_text
    root = Path(config.rootpath)
    installed = importlib.metadata.packages_distributions()  # seconds with many installed: looked up once
    conftest = declaring_conftest(config, target.name)
    declared = inside_root(Path(str(conftest.__file__)), root) if conftest is not None else None
    copies: dict[str, Path] = {}
    notes: list[str] = []
    found = ProjectModules()
    if conftest is not None:
        if declared is not None:
            copies["conftest.py"] = declared
            if "." in conftest.__name__:
                notes.append(NOTE_PACKAGE_CONFTEST.format(path=declared.as_posix(), module=conftest.__name__))
        found = project_modules([conftest], _modules_of_target(target), root, installed, skip=conftest)
        copies.update(found.copies)
        notes += found.notes
    notes += _other_hooks(config, conftest, root)
    ini = {}
    hang = config.getini("resume_matrix_hang_timeout")
    if hang and not config.stash[SETTINGS_KEY].hang_forced:  # the command line would win over a target's own
        ini["resume_matrix_hang_timeout"] = str(hang)
    return repro.Repro(
        name=item.name, target=target.name, headline=headline, excerpt=excerpt,
        command=repro_command(config, item.name, target.name), report=report, root=root, copies=copies,
        declared_in=declared, declared_outside=conftest.__name__ if conftest is not None and declared is None else None,
        outside=found.outside, not_copied=notes, ini=ini, places=machine_places(config, root, installed),
        versions=_versions(found.used), plugin_version=_version(PLUGIN_DISTRIBUTION) or "?",
        environment=environment.for_repro(target, config.stash[SETTINGS_KEY], cell_json),
    )


def declaring_conftest(config: pytest.Config, name: str) -> ModuleType | None:
    """The loaded conftest module that declares the target ``name`` (None: an installed package's, or a
    plugin's)."""
    from pytest_resume_check.plugin.target_sources import targets_in_module
    from pytest_resume_check.targets import TargetError

    for module in config.pluginmanager.get_plugins():
        if not isinstance(module, ModuleType) or not str(getattr(module, "__file__", "")).endswith("conftest.py"):
            continue
        try:
            if any(t.name == name for t in targets_in_module(module)):
                return module
        except TargetError:  # a broken RESUME_TARGETS: discovery said so already
            continue
    return None


def _modules_of_target(target: Any) -> list[str]:
    """The modules of a target's function and of its ``preload`` entries (``module`` or ``module:function``)."""
    names = [getattr(target.fn, "__module__", None), *(entry.partition(":")[0] for entry in target.preload)]
    return [name for name in names if isinstance(name, str)]


def _other_hooks(config: pytest.Config, declaring: ModuleType | None, root: Path) -> list[str]:
    """Notes on the other conftests that implement the harness's hooks (they are not copied)."""
    notes = []
    for module in config.pluginmanager.get_plugins():
        if module is declaring or not isinstance(module, ModuleType):
            continue
        if not str(getattr(module, "__file__", "")).endswith("conftest.py"):
            continue
        hooks = [h for h in HOOKS if hasattr(module, h)]
        if hooks:
            rel = inside_root(Path(str(module.__file__)), root)
            where = f"`{rel.as_posix()}`" if rel is not None else OUTSIDE_CONFTEST.format(module=module.__name__)
            notes.append(NOTE_HOOKS.format(where=where, hooks=", ".join(f"`{h}`" for h in hooks)))
    return notes


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions(used: set[str]) -> list[str]:
    """Python's version and those of the frameworks a target may need and of the distributions the copied
    modules use, where installed."""
    found = [f"Python {platform.python_version()}"]
    names = dict.fromkeys([*VERSIONS_OF, *sorted(used, key=str.lower)])
    found += [f"{dist} {version}" for dist in names if (version := _version(dist))]
    return found
