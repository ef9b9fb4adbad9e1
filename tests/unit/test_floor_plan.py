"""The floor plan: the tree names the layers, and each layer imports only the layers below it.

The package's top level holds the public modules a trainer or a script imports; everything else lives
in a subpackage named for its layer (docs/design.md, "Module map", whose "may import" column is the
rule checked here). Imports are read from the source, function-level imports included (those under
``if TYPE_CHECKING:`` are not imports at run time), so a lazy import cannot hide a cycle. No torch, no
processes: the sources are parsed, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentlightning
import pytest_resume_check

PACKAGE = Path(pytest_resume_check.__file__).parent
NAME = pytest_resume_check.__name__

#: The layers, lowest first. A module may import its own layer and the layers before it.
LAYERS = ("records", "api", "child", "process", "judge", "cells", "engine", "report", "cluster", "plugin")

#: The public modules at the top level, each in its layer (``""`` is the package itself).
PUBLIC = {"": "api", "categories": "records", "ids": "records", "digest": "records", "client": "api", "run": "api",
          "targets": "api", "hookspecs": "api", "engine": "engine", "html": "report"}

#: Subpackages that are no layer: the bundled targets and the framework glue, which use the public API.
BUNDLED = ("builtin", "integrations")
#: What the bundled modules (and agentlightning) may import of this package: the public modules.
PUBLIC_FOR_TARGETS = {f"{NAME}.{name}" for name in ("run", "targets", "client", "ids", "digest", "categories")}

#: Imports against the layers' order, each with its reason. Both are function-level and run only in the
#: child: a program's client installs the file-operation recorder in crash cells, and a command target's
#: function is the code that runs the program.
UPWARD = {
    (f"{NAME}.client", f"{NAME}.child.recorder"): "a program run as a command records its file ops in crash cells",
    (f"{NAME}.targets", f"{NAME}.child.command"): "resume_target.command's target function runs the program",
}


def module_files(package: Path, prefix: str) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((prefix, *parts))] = path
    return found


MODULES = {**module_files(PACKAGE, NAME), **module_files(Path(agentlightning.__file__).parent, "agentlightning")}


def imports_of(module: str, path: Path) -> set[str]:
    """The modules of our two packages that ``module`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def layer_of(module: str) -> str | None:
    """The layer of one of our modules; None for the bundled ones and agentlightning."""
    if not module.startswith(NAME):
        return None
    rest = module[len(NAME) + 1:]
    first = rest.split(".")[0]
    if first in BUNDLED:
        return None
    if first in LAYERS and first != "api":
        return first
    return PUBLIC[rest]


def test_the_top_level_holds_only_the_public_modules_and_the_subpackages():
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == set(PUBLIC) - {""}, f"modules at the top level that are not public: {sorted(top - set(PUBLIC))}"
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == {*LAYERS, *BUNDLED} - {"api", "engine"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(NAME)))
def test_each_module_imports_only_its_own_and_lower_layers(module):
    mine = layer_of(module)
    wrong = []
    for imported in sorted(GRAPH[module]):
        if (module, imported) in UPWARD:
            continue
        theirs = layer_of(imported)
        if mine is None:  # bundled: the public API and the bundled modules only
            ok = theirs is None or imported in PUBLIC_FOR_TARGETS
        else:
            ok = theirs is not None and LAYERS.index(theirs) <= LAYERS.index(mine)
        if not ok:
            wrong.append(f"{imported} ({theirs or 'bundled'})")
    assert not wrong, f"{module} ({mine or 'bundled'}) imports above its layer: {', '.join(wrong)}"


def test_agentlightning_uses_only_the_public_modules_of_the_harness():
    used = {imported for module, deps in GRAPH.items() if module.startswith("agentlightning") for imported in deps
            if imported.startswith(NAME)}
    assert used and used <= PUBLIC_FOR_TARGETS, sorted(used - PUBLIC_FOR_TARGETS)


def test_there_is_no_import_cycle_not_even_through_a_function_level_import():
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = path[path.index(module):] + (module,)
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in sorted(GRAPH[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, ())


def test_the_rule_sees_a_function_level_import_and_a_layer_crossing(tmp_path):
    """The checks above can fail: a lazy import upward is found, one under TYPE_CHECKING is not."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      f"    from {NAME}.engine import Engine\n"
                      f"def late():\n    from {NAME}.report import text\n")
    found = imports_of(f"{NAME}.records.probe", source)
    assert found == {f"{NAME}.report.text"}
    assert LAYERS.index(layer_of(f"{NAME}.report.text")) > LAYERS.index(layer_of(f"{NAME}.records.events"))
