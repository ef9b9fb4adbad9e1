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
README names no path of the machine either (:func:`machine_places`).

The command is the cell's rerun command without the session's paths (:func:`.options.repro_command`).
The README also says how to set the runs' environment: the declared variables with their values here,
the others by name only (:func:`.environment.for_repro`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import sysconfig
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_resume_check.plugin import environment
from pytest_resume_check.plugin.options import OPT_REPRO, SETTINGS_KEY, repro_command

ERR_REPRO_WRITE = ("resume matrix: cannot write the reproduction of {name} to {path}: {reason}; choose a writable "
                   "folder with " + OPT_REPRO)
#: A reproduction copies at most this many of the project's modules, and this many bytes of them.
MAX_MODULES = 100
MAX_MODULE_BYTES = 10 * 1024 * 1024
PLUGIN_DISTRIBUTION = "pytest-resume-check"
#: Versions a README names, when installed (looked up, never imported).
VERSIONS_OF = ("pytest", "torch", "torchdata", "numpy", "lightning", "transformers", "accelerate", "verl")
HOOKS = ("pytest_resume_check_cases", "pytest_resume_check_targets")
#: ``{where}``: the conftest's path relative to the project's root, or :data:`OUTSIDE_CONFTEST`.
NOTE_HOOKS = ("{where}, which implements {hooks}: a cell of other cases may be missing without it (copy those "
              "hooks into conftest.py)")
OUTSIDE_CONFTEST = "the conftest `{module}` from outside the project"
NOTE_TOO_MANY = "{count} more modules of the project (a reproduction copies at most {most} files, {mb} MB)"
NOTE_NOT_SOURCE = "`{name}` ({path}): not a Python source file"
NOTE_PACKAGE_CONFTEST = ("`{path}` is imported as `{module}` (a conftest inside a package): its relative imports "
                         "do not work as the top-level conftest.py here")
#: What a README writes for the places of the machine a failure report names (:func:`machine_places`).
PLACE_PYTHON = "python"
PLACE_BASETEMP = "<basetemp>"
PLACE_SITE_PACKAGES = "<site-packages>"
PLACE_STDLIB = "<stdlib>"
PLACE_SYS_PATH = "<sys.path>"
PLACE_PREFIX = "<sys.prefix>"
PLACE_BASE_PREFIX = "<sys.base_prefix>"
PLACE_HOME = "~"


@dataclass(frozen=True)
class ProjectModules:
    """What a reproduction takes of the project's modules (:func:`project_modules`)."""

    #: Import path in the folder (``pkg/mod.py``) to the module's file, relative to the project's root.
    copies: dict[str, Path] = field(default_factory=dict)
    #: What was left out, each said in a few words.
    notes: list[str] = field(default_factory=list)
    #: The installed distributions the modules use.
    used: set[str] = field(default_factory=set)
    #: Modules that would be copied but lie outside the project's root, by name.
    outside: list[str] = field(default_factory=list)


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


def project_modules(roots: list[ModuleType], names: list[str], root: Path, installed: Mapping[str, Any],
                    skip: ModuleType | None = None) -> ProjectModules:
    """The project's own modules among ``names`` and those that ``roots`` use, found through their globals
    (modules, and the modules of functions, classes and other objects), and through those modules'
    globals in turn. A module of an installed distribution (this package too; a project installed in
    editable mode also counts as installed), of the standard library, or another conftest is not the
    project's (``installed``: :func:`importlib.metadata.packages_distributions`); one whose file lies outside
    ``root`` is named (``outside``), never copied, nor followed."""
    found = ProjectModules()
    seen: set[str] = set()
    queue: deque[ModuleType] = deque(roots)
    size = left_out = 0

    def take(name: str) -> None:
        nonlocal size, left_out
        if name in seen:
            return
        seen.add(name)
        module = sys.modules.get(name)
        if module is None or module is skip:
            return
        if not _is_project_module(module, installed):
            found.used.update(installed.get(name.partition(".")[0], ()))
            return
        path = Path(str(module.__file__))
        rel = inside_root(path, root)
        if rel is None:  # a sys.path entry elsewhere: the machine's, not the project's
            found.outside.append(name)
            return
        if path.suffix != ".py":
            found.notes.append(NOTE_NOT_SOURCE.format(name=name, path=rel.as_posix()))
            return
        if len(found.copies) >= MAX_MODULES or size + path.stat().st_size > MAX_MODULE_BYTES:
            left_out += 1
            return
        size += path.stat().st_size
        found.copies[_import_path(name, path)] = rel
        queue.append(module)
        if "." in name:  # a package's __init__ comes along
            take(name.rpartition(".")[0])

    for name in names:
        take(name)
    while queue:
        for name in _names_used(queue.popleft()):
            take(name)
    if left_out:
        found.notes.append(NOTE_TOO_MANY.format(count=left_out, most=MAX_MODULES, mb=MAX_MODULE_BYTES // 2**20))
    found.used.discard(PLUGIN_DISTRIBUTION)
    return found


def inside_root(path: Path, root: Path) -> Path | None:
    """``path`` relative to the project's ``root``, None when it lies outside: as named, and with every link
    resolved too (a file linked from elsewhere is not the project's)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        return None
    named = Path(os.path.abspath(path))
    return named.relative_to(root) if named.is_relative_to(root) else resolved.relative_to(root.resolve())


def machine_places(config: pytest.Config, root: Path, installed: Mapping[str, Any]) -> dict[str, str]:
    """The absolute paths of this machine a failure report may name (a traceback's files, the kept folders,
    the interpreter), each with what a README writes instead: the project's root ``""`` (paths relative to
    it), the python executable ``python``, pytest's base temporary directory, where packages are installed
    (an editable one's folder as if it were there), the standard library, other ``sys.path`` entries, the
    prefixes of the interpreter, the home folder. A place inside the project's root is written relative to
    the root instead, save the executable. ``installed``: the top-level names of installed distributions."""
    places: dict[str, str] = {}

    def add(path: object, name: str) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path) or not os.path.isabs(path):
            return
        for form in (os.fspath(path), os.path.abspath(path), os.path.realpath(path)):
            places.setdefault(form, name)

    add(root, "")
    add(sys.executable, PLACE_PYTHON)
    factory = getattr(config, "_tmp_path_factory", None)
    try:
        add(factory.getbasetemp() if factory is not None else None, PLACE_BASETEMP)
    except OSError:  # not made: no kept folder names it
        pass
    paths = sysconfig.get_paths()
    for key, name in (("purelib", PLACE_SITE_PACKAGES), ("platlib", PLACE_SITE_PACKAGES),
                      ("stdlib", PLACE_STDLIB), ("platstdlib", PLACE_STDLIB)):
        add(paths.get(key), name)
    for top in installed:
        module = sys.modules.get(top)
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and Path(file).name == "__init__.py":
            add(os.path.dirname(file), f"{PLACE_SITE_PACKAGES}/{top}")
    for entry in list(sys.path):
        add(entry, PLACE_SYS_PATH)
    add(sys.prefix, PLACE_PREFIX)
    add(sys.exec_prefix, PLACE_PREFIX)
    add(sys.base_prefix, PLACE_BASE_PREFIX)
    add(sys.base_exec_prefix, PLACE_BASE_PREFIX)
    add(os.path.expanduser("~"), PLACE_HOME)
    real_root = os.path.realpath(root)
    return {path: name for path, name in places.items()
            if os.path.abspath(path) != "/"
            and (name in ("", PLACE_PYTHON) or not _below(os.path.abspath(path), os.fspath(root))
                 and not _below(os.path.realpath(path), real_root))}


def _below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _names_used(module: ModuleType) -> list[str]:
    """The modules a module's globals come from."""
    names = []
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            names.append(value.__name__)
            continue
        owner = getattr(value, "__module__", None) if callable(value) else type(value).__module__
        if isinstance(owner, str):
            names.append(owner)
    return names


def _modules_of_target(target: Any) -> list[str]:
    """The modules of a target's function and of its ``preload`` entries (``module`` or ``module:function``)."""
    names = [getattr(target.fn, "__module__", None), *(entry.partition(":")[0] for entry in target.preload)]
    return [name for name in names if isinstance(name, str)]


def _is_project_module(module: ModuleType, installed: Mapping[str, Any]) -> bool:
    """A module with a source file that is neither the standard library's nor an installed distribution's
    (``installed``: top-level names to distributions), nor another conftest."""
    file = getattr(module, "__file__", None)
    name = module.__name__
    top = name.partition(".")[0]
    if not file or top in sys.stdlib_module_names or top in installed or name.rpartition(".")[2] == "conftest":
        return False
    resolved = Path(file).resolve()
    return not any(resolved.is_relative_to(p) for p in _installed_paths())


def _import_path(name: str, path: Path) -> str:
    """Where a module goes in the folder: its dotted name as a path (``pkg/__init__.py`` for a package)."""
    parts = name.split(".")
    return "/".join([*parts, "__init__.py"]) if path.name == "__init__.py" else "/".join(parts[:-1] + [path.name])


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


def _installed_paths() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]


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
