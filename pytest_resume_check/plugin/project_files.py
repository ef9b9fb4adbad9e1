"""What a reproduction folder takes of the project and of this machine: which of the project's own
modules it copies (those under pytest's rootdir only; one elsewhere is named, never copied) and which of
the machine's places a README names instead of their paths.

Used by :mod:`.repro`, which decides what a failing cell's folder holds; this module only looks at the
loaded modules and the interpreter's paths, and reads nothing of the cell.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: A reproduction copies at most this many of the project's modules, and this many bytes of them.
MAX_MODULES = 100
MAX_MODULE_BYTES = 10 * 1024 * 1024
#: This plugin's distribution: never among the ones a README lists as the copied modules' needs.
PLUGIN_DISTRIBUTION = "pytest-resume-check"
NOTE_TOO_MANY = "{count} more modules of the project (a reproduction copies at most {most} files, {mb} MB)"
NOTE_NOT_SOURCE = "`{name}` ({path}): not a Python source file"
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


def _installed_paths() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
