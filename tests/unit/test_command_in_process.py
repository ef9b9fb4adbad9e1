"""Which command targets run their Python program in the run's own process, and what the fork server preloads
for them: decided from the command and the program's source, nothing imported or started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_resume_check.child.command import MODULE, SCRIPT, program_imports, python_program
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
