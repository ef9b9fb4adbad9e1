"""Modules that promise to import little, each imported in a fresh interpreter: the HTML report needs only the
standard library, and the state walker imports neither torch nor numpy (the other cheap imports:
test_imports.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_html_module_needs_only_the_standard_library():
    code = ("import sys; before = set(sys.modules); import pytest_resume_check.report.html; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = set(json.loads(out.stdout.replace("'", '"')))
    assert "pytest" not in new and "_pytest" not in new
    assert new - {"pytest_resume_check"} <= set(sys.stdlib_module_names)


@pytest.mark.slow
def test_importing_the_walker_imports_neither_torch_nor_numpy():
    code = ("import sys, pytest_resume_check.records.state_walk; "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
