"""Every CPython-private name the harness uses goes through one adapter, ``child.cpython``: no other module
of the package touches a private attribute of ``multiprocessing``, ``atexit`` or ``threading``, nor names
one of the adapter's private names as a string (``getattr(module, "_name")``). The sources are parsed, not
imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_resume_check
from pytest_resume_check.child import cpython

PACKAGE = Path(pytest_resume_check.__file__).parent
ADAPTER = Path(cpython.__file__)
#: The standard modules whose private names only the adapter may touch.
WRAPPED = ("multiprocessing", "atexit", "threading")
ADAPTED = {name for names in cpython.PRIVATE_NAMES.values() for name in names}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_wrapped(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in WRAPPED)


def private_uses(source: str) -> list[str]:
    """Where ``source`` touches a private name of a wrapped module, or names one the adapter uses."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if is_wrapped(node.module) and is_private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")

    def dotted(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return aliases.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = dotted(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = dotted(node.value)
            if base and is_wrapped(base):
                found.append(f"line {node.lineno}: {base}.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ADAPTED:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_check_finds_each_way_of_touching_a_private_name():
    source = ("import multiprocessing.forkserver\nimport atexit as ax\nfrom multiprocessing import util\n"
              "from threading import _threading_atexits\n"
              "multiprocessing.forkserver._forkserver\nax._clear()\nutil._exit_function\n"
              "getattr(util, '_exit_function')\n")
    assert len(private_uses(source)) == 5


def test_public_names_and_our_own_private_names_pass():
    source = ("import multiprocessing\nimport threading\nmultiprocessing.get_context('spawn')\n"
              "threading.main_thread()\nself._thread = None\nthreading.Thread.__init__\n")
    assert private_uses(source) == []


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py") if p != ADAPTER),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_but_the_adapter_touches_a_private_name_of_the_standard_modules_it_wraps(path):
    assert private_uses(path.read_text(encoding="utf-8")) == [], (
        f"{path.relative_to(PACKAGE)}: use pytest_resume_check.child.cpython for CPython-private names")


def test_the_adapter_lists_every_private_name_it_touches():
    """What the adapter's version check looks for is every private name it reads or writes."""
    tree = ast.parse(ADAPTER.read_text(encoding="utf-8"))
    own = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    touched = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and is_private(node.attr)}
    touched |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value.isidentifier() and is_private(node.value)}
    assert touched - own == ADAPTED
