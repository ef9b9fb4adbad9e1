"""Which command targets run their Python program in the run's own process, and what the fork server preloads
for them: decided from the command and the program's source, nothing imported or started here."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from pytest_resume_check.child import imports
from pytest_resume_check.child.command import MODULE, SCRIPT, program_imports, python_program
from pytest_resume_check.child.imports import ImportWatch
from pytest_resume_check.records.plan import CommandSpec

SUPPORT = Path(__file__).resolve().parents[1] / "support"
CLIENT_SCRIPT = "import json\nimport local_helper\n\nfrom pytest_resume_check import client\n"


def spec(argv, cwd, **kw) -> CommandSpec:
    return CommandSpec(tuple(argv), str(cwd), **kw)


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "train.py").write_text(CLIENT_SCRIPT)
    (tmp_path / "local_helper.py").write_text("")
    (tmp_path / "plain.py").write_text("import json\n")
    return tmp_path


def test_a_client_program_started_by_python_runs_in_the_runs_process(project):
    assert python_program(spec(["{python}", "train.py", "--out", "{checkpoint_dir}"], project)) == (SCRIPT, "train.py")
    module = spec(["{python}", "-m", "pytest_resume_check.builtin.train_script"], project)
    assert python_program(module) == (MODULE, "pytest_resume_check.builtin.train_script")
    zero_change = spec(["{python}", "plain.py"], project, checkpoints="step_*.pt")
    assert python_program(zero_change) == (SCRIPT, "plain.py")  # it reports nothing: the watcher runs around it


@pytest.mark.parametrize(("argv", "kw"), [
    (["{python}", "train.py"], {"fresh_interpreter": True}),
    (["{python}", "train.py"], {"env": (("PYTHONPATH", "/elsewhere"),)}),
    (["{python}", "-u", "train.py"], {}),
    (["/usr/bin/python3", "train.py"], {}),
    (["{python}", "plain.py"], {}),  # reports nothing and is no zero-change target: the harness says so as before
    (["{python}", str(SUPPORT / "command_programs.py"), "garbled", "{checkpoint_dir}"], {}),  # speaks the protocol
    (["{python}", "{case[script]}"], {}),
    (["{python}", "missing.py"], {}),
    (["bash", "train.sh"], {}),
], ids=["fresh", "python-env", "interpreter-option", "another-python", "no-client", "own-protocol", "placeholder",
        "missing", "bash"])
def test_anything_else_gets_a_process_of_its_own(project, argv, kw):
    assert python_program(spec(argv, project, **kw)) is None
    assert program_imports(spec(argv, project, **kw)) == []


def test_the_server_preloads_the_installed_packages_a_program_imports_not_its_own_modules(project):
    imports = dict(program_imports(spec(["{python}", "train.py"], project)))
    assert set(imports) == {"json", "pytest_resume_check"}  # local_helper lies beside the script: left to runs
    assert imports["json"].endswith("json/__init__.py")


def test_the_server_preloads_what_a_program_imports_anywhere_and_what_its_own_modules_import(tmp_path):
    (tmp_path / "train.py").write_text(
        "from typing import TYPE_CHECKING\n\nimport helpers\n\nif TYPE_CHECKING:\n    import decimal\n\n\n"
        "def train():\n    import csv\n    if csv:\n        from email import message\n")
    (tmp_path / "helpers.py").write_text("def load():\n    import fractions\n")
    imports = program_imports(spec(["{python}", "train.py"], tmp_path, checkpoints="step_*.pt"))
    # helpers lies beside the script (left to runs); decimal is imported only for a type checker
    assert [name for name, _ in imports] == ["typing", "csv", "email", "fractions"]


def test_a_module_beside_the_script_is_never_preloaded_in_its_place_by_an_installed_one(tmp_path):
    (tmp_path / "train.py").write_text("def train():\n    import json\n    import csv\n")
    (tmp_path / "json.py").write_text("")  # the script's own json, which a run imports from its folder
    imports = program_imports(spec(["{python}", "train.py"], tmp_path, checkpoints="step_*.pt"))
    assert [name for name, _ in imports] == ["csv"]


def test_a_run_names_the_packages_the_program_imported_not_their_dependencies(tmp_path, monkeypatch):
    site, own = tmp_path / "site", tmp_path / "program"
    (site / "watched_top").mkdir(parents=True)
    (site / "watched_top" / "__init__.py").write_text("import watched_dep\n")
    for name in ("watched_dep", "watched_dynamic", "watched_own_dep"):
        (site / f"{name}.py").write_text("")
    own.mkdir()
    (own / "watched_own.py").write_text("import watched_own_dep\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(own))
    names = ("watched_top", "watched_dep", "watched_dynamic", "watched_own", "watched_own_dep")
    watch = ImportWatch([own])
    watch.start()
    try:
        importlib.import_module("watched_top")  # imports watched_dep: its dependency, preloaded with it
        importlib.import_module("watched_dynamic")
        importlib.import_module("watched_own")  # the program's own module: what it imports counts
        importlib.import_module("json")  # the standard library: never named
    finally:
        seen = watch.stop()
        for name in names:
            sys.modules.pop(name, None)
    assert seen == ["watched_top", "watched_dynamic", "watched_own_dep"]
    assert watch not in sys.meta_path


@pytest.mark.parametrize(("source", "only"), [
    ("import re\nimport sys\nfrom _pytest.config import _console_main\nif __name__ == '__main__':\n"
     "    sys.exit(_console_main())\n", True),  # what pip writes for pytest
    ('"""Doc."""\nimport torch\nif __name__ == "__main__":\n    main()\n', True),
    ("import torch\nmain()\n", False),
    ("import sys\nSTEPS = 4\n", False),
    ("if __name__ == '__main__':\n    pass\nelse:\n    work()\n", False),
    ("if __name__ != '__main__':\n    work()\n", False),
])
def test_a_script_only_imports_when_its_top_level_does_nothing_else(source, only):
    assert imports.only_imports(ast.parse(source)) is only
