"""What a command target's Python program imports: read from its source, for the fork server to preload
(:func:`installed_imports`), and seen in a run, for the note on where the runs' time went (:class:`ImportWatch`).

The source is read wherever an import stands (in a function, under a condition), since a run pays for a
package its ``train()`` imports as much as for one imported at the top; the program's own modules beside it
are read by their source too, one level deep, and never imported here.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

#: The harness's own package: already in every run's process, never worth naming.
OWN_PACKAGE = "pytest_resume_check"
#: What the import system's own frames are named; the module that asked for an import lies below them.
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib", "_frozen_importlib_external")


def imported_names(tree: ast.Module, anywhere: bool = False) -> list[str]:
    """The top-level names of the absolute imports of a module: its top-level statements (also inside a
    top-level ``try``), or ``anywhere`` in it (function bodies, conditionals), less those under
    ``if TYPE_CHECKING:``, which never run."""
    nodes: list[ast.AST] = []
    if not anywhere:
        for statement in tree.body:
            nodes += statement.body if isinstance(statement, ast.Try) else [statement]
    else:
        typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node.test)
                       for stmt in node.body for inner in ast.walk(stmt)}
        nodes = [node for node in ast.walk(tree) if id(node) not in typing_only]
    names: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def only_imports(tree: ast.Module) -> bool:
    """Whether a script's top level does nothing but import (and hold a docstring and an ``if __name__ ==
    "__main__":`` block, which does not run when it is imported as another module): what a console script
    generated for an entry point is."""
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue
        if isinstance(statement, ast.If) and not statement.orelse and _main_guard(statement.test):
            continue
        return False
    return True


def script_only_imports(path: Path) -> bool:
    """Whether the script at ``path`` can be read and parsed and :func:`only_imports`."""
    tree = _parsed(path)
    return tree is not None and only_imports(tree)


def _main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def own_module(name: str, folders: Iterable[Path]) -> Path | None:
    """The file of the program's own module ``name`` (``name.py``, or a package's ``__init__.py``) in one of
    ``folders`` (the script's and the working folder), None when it has none there."""
    for folder in folders:
        for candidate in (folder / f"{name}.py", folder / name / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _parsed(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes())
    except (OSError, ValueError, SyntaxError):
        return None


def installed_imports(tree: ast.Module, script: Path, cwd: Path) -> list[tuple[str, str]]:
    """The installed packages the program ``tree`` (the source of ``script``, run in ``cwd``) imports anywhere
    in it, and those its own modules beside it import (one level: read by source, never imported), as
    (top-level name, file). The program's own modules are left out (importing them may have effects, and a
    run imports them from its folder), also where an installed package has the same name."""
    folders = list(dict.fromkeys([script.parent.resolve(), cwd.resolve()]))
    names = imported_names(tree, anywhere=True)
    for name in list(names):
        path = own_module(name, folders)
        inner = _parsed(path) if path is not None else None
        if inner is not None:
            names += imported_names(inner, anywhere=True)
    out: list[tuple[str, str]] = []
    for top in dict.fromkeys(names):
        if top == "__future__" or own_module(top, folders) is not None:
            continue
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        origin = found.origin if found is not None else None
        if origin is None or origin in ("built-in", "frozen"):
            continue
        where = Path(origin).resolve()
        if not set(folders) & {where.parent, where.parent.parent}:
            out.append((top, origin))
    return out


class ImportWatch:
    """The packages a run imports that its process did not have when the watch started (in a run forked from the
    fork server: what the server had not preloaded), each named once, as the program asked for it: a package
    that another package imported in the run is that one's dependency and not named (preloading the one
    imports it). Installed first on ``sys.meta_path``, it sees every import of a new module (``import``
    statements, ``importlib.import_module``) and finds nothing itself; :meth:`stop` removes it."""

    def __init__(self, folders: Sequence[Path]):
        #: The program's own folders: its modules there are left to each run, never named.
        self._folders = [Path(f).resolve() for f in folders]
        #: (top-level name, the top-level name of the module that imported it), in the order imported.
        self._seen: list[tuple[str, str]] = []

    def start(self) -> None:
        """Watch the imports from now on."""
        sys.meta_path.insert(0, self)

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> None:
        """Note a new top-level module and who imported it; leave finding it to the other finders."""
        if "." not in name and name not in sys.stdlib_module_names:
            self._seen.append((name, _importer(sys._getframe(1))))

    def stop(self) -> list[str]:
        """Stop watching; the top-level names of the packages the program imported since :meth:`start` (those
        that were imported and have a file), in the order first imported."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        own = {name for name, _ in self._seen if self._own(name)}
        new = {name for name, _ in self._seen} - own
        out = []
        for name, importer in self._seen:
            if (importer in new and importer != name) or name in own or name == OWN_PACKAGE:
                continue
            if getattr(sys.modules.get(name), "__file__", None) is not None:
                out.append(name)
        return list(dict.fromkeys(out))

    def _own(self, name: str) -> bool:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file is None:
            return own_module(name, self._folders) is not None
        where = Path(file).resolve()
        return bool(set(self._folders) & {where.parent, where.parent.parent})


def _importer(frame: FrameType | None) -> str:
    """The top-level name of the module whose code asked for the import under way (``__main__`` for the
    program), below the import system's own frames."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.split(".")[0] not in _IMPORT_MACHINERY:
            return name.split(".")[0]
        frame = frame.f_back
    return ""
