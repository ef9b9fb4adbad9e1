"""The seams are typed: where two layers meet, the annotation says what crosses, never ``Any``.

Two checks, both on the parsed sources (nothing is imported, so names imported under ``TYPE_CHECKING`` are
read like any other):

- the path of one cell, from its pytest item to its verdict and its JSON (the item's session, the engine, the
  run context and its channels, the hook specs, the fixture, the cell JSON's writer and its readers in the
  plugin) has no ``Any`` in its annotations at all;
- the count of ``Any`` in the annotations of the public modules' public names (and of those seams) does not
  rise above :data:`CEILING`: a new public signature says what it takes.

A ``**kwargs`` passed on to pytest's node constructor (``from_parent``) is not counted: pytest types it so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest_resume_check

PACKAGE = Path(pytest_resume_check.__file__).parent

#: The public modules (what a trainer, a program or a script imports), whose public names are counted.
PUBLIC_MODULES = ("targets", "run", "client", "engine", "hookspecs", "categories", "digest", "ids", "html",
                  "plugin.fixtures")

#: One cell's path, from its item to its verdict and report: (module, qualified name; "" for the whole module).
#: None of their annotations may name ``Any``.
CELL_PATH = (
    ("plugin.items", "Matrix"),
    ("plugin.items", "ResumeCell"),
    ("plugin.session", "MatrixSession.__init__"),
    ("plugin.session", "MatrixSession.engine"),
    ("plugin.session", "MatrixSession.executor"),
    ("plugin.session", "MatrixSession.targets"),
    ("plugin.fixtures", "ResumeCheck"),
    ("hookspecs", ""),
    ("engine", "Engine.run_cell"),
    ("run", "RunContext.__init__"),
    ("run", "EventSink"),
    ("run", "ControlChannel"),
    ("run", "SaveWatcher"),
    ("child.main", "child_main"),
    ("child.main", "EventConnection"),
    ("child.main", "ConnectionSink.__init__"),
    ("report.text", "cell_json"),
    ("report.text", "unjudged_cell_json"),
    ("plugin.reports", "carry"),
    ("plugin.reports", "carried"),
    ("plugin.reports", "unjudged"),
    ("plugin.summary", "write_summary"),
    ("cluster.outcomes", "CellOutcome"),
)

#: The seams whose ``Any`` are counted with the public names' (the cell JSON's parts where the values are the
#: target's own: its case's parameters, a ledger's rows).
COUNTED_SEAMS = (*CELL_PATH, ("records.cell_json", ""))

#: The most ``Any`` the public signatures and the seams may carry (lower it when you remove some).
CEILING = 40


def _path(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _source(module: str) -> ast.Module:
    return ast.parse(_path(module).read_text(encoding="utf-8"))


def _names_any(node: ast.AST | None) -> int:
    """How many times an annotation names ``Any`` (``Any``, ``typing.Any``, or inside a string)."""
    if node is None:
        return 0
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _names_any(ast.parse(node.value, mode="eval").body)
    return sum(1 for n in ast.walk(node) if (isinstance(n, ast.Name) and n.id == "Any")
               or (isinstance(n, ast.Attribute) and n.attr == "Any"))


def _annotations(node: ast.AST, qualname: str) -> Iterator[tuple[str, int, ast.AST | None]]:
    """(where, line, annotation) of a function's signature, or of a class's annotated attributes and of its
    methods' signatures (with the attributes annotated in ``__init__``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                yield f"{qualname}({arg.arg})", arg.lineno, arg.annotation
        yield f"{qualname} ->", node.lineno, node.returns
        for inner in ast.walk(node):
            if isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Attribute):
                yield f"{qualname}: self.{inner.target.attr}", inner.lineno, inner.annotation
    elif isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                yield f"{qualname}.{item.target.id}", item.lineno, item.annotation
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from _annotations(item, f"{qualname}.{item.name}")


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
#: Marks a seam the source no longer has (renamed or moved): the lists above must follow the code.
MISSING = ast.Name("Any")


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: ast.AST = tree
    for part in qualname.split("."):
        found = [n for n in ast.iter_child_nodes(scope) if isinstance(n, _DEFS) and n.name == part]
        if not found:
            return None
        scope = found[0]
    return scope


def _seam(module: str, qualname: str) -> Iterator[tuple[str, int, ast.AST | None]]:
    if not _path(module).is_file():
        yield f"{module}: not in the source", 0, MISSING
        return
    tree = _source(module)
    if qualname and _find(tree, qualname) is None:
        yield f"{module} {qualname}: not in the source", 0, MISSING
        return
    nodes = [(n.name, n) for n in tree.body if isinstance(n, _DEFS)]
    for name, node in nodes if not qualname else [(qualname, _find(tree, qualname))]:
        for where, line, annotation in _annotations(node, name):
            yield f"{module}:{line} {where}", line, annotation


def _public(module: str) -> Iterator[tuple[str, int, ast.AST | None]]:
    """The annotations of a module's public names (public classes' public methods and attributes)."""
    tree = _source(module)
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            for where, line, annotation in _annotations(node, node.name):
                private = any(part.startswith("_") and not part.startswith("__")
                              for part in where.split("(")[0].split(" ")[0].split(".")[1:])
                if not private:
                    yield f"{module}:{line} {where}", line, annotation


def _with_any(entries: Iterator[tuple[str, int, ast.AST | None]]) -> dict[str, int]:
    found = {}
    for where, _, annotation in entries:
        if where.endswith("(kwargs)"):  # pytest's from_parent passes them on, untyped
            continue
        count = _names_any(annotation)
        if count:
            found[where] = count
    return found


def test_one_cell_from_its_item_to_its_report_reads_through_typed_calls():
    found = {}
    for module, qualname in CELL_PATH:
        found.update(_with_any(_seam(module, qualname)))
    assert not found, "Any on the path of a cell:\n" + "\n".join(sorted(found))


def test_the_count_of_any_in_public_signatures_and_seams_does_not_rise():
    found: dict[str, int] = {}
    for module in PUBLIC_MODULES:
        found.update(_with_any(_public(module)))
    for module, qualname in COUNTED_SEAMS:
        found.update(_with_any(_seam(module, qualname)))
    total = sum(found.values())
    assert total <= CEILING, (f"{total} Any in public signatures and seams, more than {CEILING}; type these "
                              "(or, if one cannot be, raise CEILING and say why):\n"
                              + "\n".join(f"{where} ({n})" for where, n in sorted(found.items())))


def test_the_counter_finds_any_in_a_signature_an_attribute_and_a_string():
    tree = ast.parse("class C:\n    x: 'dict[str, Any]'\n    def f(self, a: typing.Any, **kw: Any) -> list[Any]:\n"
                     "        self.y: Any = None\n")
    found = _with_any(_annotations(tree.body[0], "C"))
    assert found == {"C.x": 1, "C.f(a)": 1, "C.f(kw)": 1, "C.f ->": 1, "C.f: self.y": 1}


def test_every_hook_spec_is_declared_with_pytest_hookspec():
    tree = _source("hookspecs")
    hooks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("pytest_")]
    bare = [h.name for h in hooks
            if not any("hookspec" in ast.unparse(d) for d in h.decorator_list)]
    assert hooks and not bare, f"hook specs without @pytest.hookspec: {bare}"
