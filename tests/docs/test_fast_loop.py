"""The fast loop CONTRIBUTING.md documents (``pytest tests/unit``) stays fast: no test under tests/unit starts a
process (an interpreter, a pytest, an engine's runs, a browser), directly or through a fixture or helper of its
module, or carries the ``slow`` mark: such a test belongs in another wing. This reads the source; the guard in
tests/unit/conftest.py refuses a process at run time, however it is started. The mark stays registered for the
tests of the other wings that carry it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"

#: What in a function's source starts a process: a call of one of these names or attributes.
STARTERS = ("subprocess", "Popen", "fork", "Engine", "chromium")
#: The mark, as a decorator or a module's ``pytestmark``.
SLOW = "mark.slow"
#: Unit test modules that start processes, and why they may: the guard's own tests try, to see it refuse.
ALLOWED = {"test_no_processes.py": "tries every way to start a process, to see tests/unit/conftest.py refuse it"}


def starts_a_process(node: ast.AST) -> bool:
    """Whether ``node`` calls something that starts a process, read from its names (no import, no run)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            called = ast.unparse(sub.func)
            if any(part in STARTERS for part in called.split(".")):
                return True
    return False


def slow_or_process_tests(source: str) -> list[str]:
    """The test functions of a module that start a process, themselves or through a fixture or helper of the
    same module, or are marked slow (all of them when the module's ``pytestmark`` is)."""
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    tests = sorted(name for name in functions if name.startswith("test_"))
    if any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets[0]) and SLOW in ast.unparse(n.value)
           for n in tree.body):
        return tests
    # A helper or fixture starts a process if it does so itself or calls (or takes as fixture) one that does.
    starting = {name for name, fn in functions.items() if starts_a_process(fn)}
    while True:
        more = {name for name, fn in functions.items() if name not in starting and uses(fn, starting)}
        if not more:
            break
        starting |= more
    return [name for name in tests
            if name in starting or any(SLOW in ast.unparse(d) for d in functions[name].decorator_list)]


def uses(fn: ast.FunctionDef, names: set[str]) -> bool:
    """Whether ``fn`` names one of ``names`` (calls it, or takes it as an argument: a fixture)."""
    if any(arg.arg in names for arg in fn.args.args):
        return True
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(fn))


def test_the_slow_marker_is_registered():
    # Read as text: tomllib is Python 3.11's, and the project supports 3.10.
    ini = (ROOT / "pyproject.toml").read_text().split("[tool.pytest.ini_options]")[1].split("\n[")[0]
    assert re.search(r'^markers = \[\n(    "[^"]*",\n)*    "slow: ', ini, re.M), ini


@pytest.mark.parametrize("module", sorted(p.name for p in UNIT.glob("test_*.py") if p.name not in ALLOWED))
def test_no_unit_test_starts_a_process_or_is_marked_slow(module):
    assert slow_or_process_tests((UNIT / module).read_text()) == [], f"tests/unit/{module}: move these to another wing"


def test_each_module_allowed_to_start_processes_is_a_unit_test_module():
    assert {name for name in ALLOWED if (UNIT / name).is_file()} == set(ALLOWED)


def test_the_check_finds_a_process_started_through_a_fixture_and_a_helper_and_a_slow_mark():
    source = '''
import pytest, subprocess

def helper():
    return subprocess.run(["true"])

@pytest.fixture
def cells(tmp_path):
    return Engine(tmp_path).run_cell(None)

def test_direct():
    subprocess.run(["true"])

def test_through_helper():
    helper()

def test_through_fixture(cells):
    pass

@pytest.mark.slow
def test_marked(cells):
    pass

def test_pure():
    assert 1
'''
    found = ["test_direct", "test_marked", "test_through_fixture", "test_through_helper"]
    assert slow_or_process_tests(source) == found
    marked_module = "import pytest\npytestmark = pytest.mark.slow\n" + source
    assert slow_or_process_tests(marked_module) == sorted([*found, "test_pure"])
