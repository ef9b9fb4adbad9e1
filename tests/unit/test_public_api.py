"""Every path a user imports or names keeps working, wherever its code lives.

README.md and docs/ name these paths; the package's layout behind them may change (docs/design.md,
"Module map"), these may not. The client a program reports through offers what a Python target's
``RunContext`` offers, or says here why not.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from optional import requires

import pytest_resume_check

#: Names of the package's top level (imported lazily by ``pytest_resume_check.__getattr__``).
TOP_LEVEL = ("resume_target", "Target", "Contract", "RunContext", "KillSpec", "ids_of", "WithIds",
             "EXACTLY_ONCE", "EXACTLY_ONCE_ORDERED", "state_of")

#: ``module: names`` users import from it.
PUBLIC = {
    "pytest_resume_check.targets": ("resume_target", "Target", "Contract", "TargetError", "EXACTLY_ONCE",
                                    "EXACTLY_ONCE_ORDERED"),
    "pytest_resume_check.run": ("RunContext", "KillSpec", "RESUME_AUTO", "RESUME_PATH", "RESUME_DISABLED",
                                "RESUME_MODES"),
    "pytest_resume_check.client": ("connect", "Run", "ProtocolError"),
    "pytest_resume_check.ids": ("ids_of", "WithIds"),
    "pytest_resume_check.categories": ("TABLE", "markdown_table"),
    "pytest_resume_check.digest": (),
    "pytest_resume_check.html": ("write_report", "render"),
    "pytest_resume_check.engine": ("Engine",),
    "pytest_resume_check.hookspecs": ("pytest_resume_check_cases", "pytest_resume_check_targets",
                                      "pytest_resume_check_cell_result"),
    "pytest_resume_check.plugin": ("resume_check",),
    "pytest_resume_check.integrations.durable": (),
    "pytest_resume_check.builtin": (),
}

#: The integrations, each with the framework it needs.
INTEGRATIONS = {"lightning": "lightning", "accelerate": "accelerate", "hf_trainer": "transformers"}

#: Every option and ini key the docs name.
OPTIONS = ("--resume-matrix", "--resume-matrix-mode", "--resume-matrix-seed", "--resume-matrix-target",
           "--resume-matrix-cell", "--resume-matrix-hang-timeout", "--resume-matrix-json",
           "--resume-matrix-isolation", "--resume-matrix-exhaustive", "--resume-matrix-html",
           "--resume-matrix-repro", "--resume-matrix-step-summary")
INI_KEYS = ("resume_matrix_targets", "resume_matrix_seed", "resume_matrix_hang_timeout", "resume_matrix_json",
            "resume_matrix_isolation", "resume_matrix_exhaustive", "resume_matrix_html", "resume_matrix_repro",
            "resume_matrix_step_summary")

#: What one side has that the other has not, and why. A Python target can never be outside the
#: harness; a program can (run by hand), so only it asks.
ONLY_CLIENT = {"active": "a program also runs by hand, outside the harness; a Python target never does"}
ONLY_RUN_CONTEXT = {"plan": "the harness's own plan of the run, not a report call",
                    "settings": "read only to name a framework's known bug, which a command target's cells never "
                                "are (its program's framework and version are its own)"}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_the_top_level_names_import(name):
    assert getattr(pytest_resume_check, name) is not None
    assert name in pytest_resume_check.__all__


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_offers_its_names(module):
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_command_declaration_hangs_off_resume_target():
    from pytest_resume_check import resume_target

    assert callable(resume_target.command)


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_each_integration_imports_where_its_framework_is_installed(name):
    pytest.importorskip("torch")
    pytest.importorskip(INTEGRATIONS[name])
    importlib.import_module(f"pytest_resume_check.integrations.{name}")


@requires("torch", "torchdata")
def test_the_preload_strings_users_copy_name_real_modules_and_functions():
    from pytest_resume_check.builtin.targets import TARGETS

    entries = {entry for target in TARGETS for entry in target.preload if entry.startswith("pytest_resume_check")}
    assert "pytest_resume_check.builtin.loop:warm_up" in entries
    for entry in sorted(entries):
        module, _, function = entry.partition(":")
        imported = importlib.import_module(module)
        assert not function or callable(getattr(imported, function)), entry


def test_the_entry_points_name_the_plugin_and_the_bundled_targets():
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("resume-check") == "pytest_resume_check.plugin"
    targets = {ep.name: ep.value for ep in entry_points(group="pytest_resume_check.targets")}
    assert targets.get("builtin") == "pytest_resume_check.builtin.targets:TARGETS"


@pytest.mark.slow
def test_every_option_and_ini_key_the_docs_name_is_offered():
    shown = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    missing = [name for name in (*OPTIONS, *INI_KEYS) if name not in shown]
    assert not missing, f"pytest --help does not offer {missing}"


def public_names(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_client_offers_what_a_run_context_offers():
    from pytest_resume_check.client import Run
    from pytest_resume_check.run import RunContext

    program = public_names(Run())  # inactive: outside the harness; its attributes are set on the instance
    target = public_names(RunContext) | {"plan"}  # properties and methods; plan is set on the instance
    assert program - target == set(ONLY_CLIENT), sorted(program - target)
    assert target - program == set(ONLY_RUN_CONTEXT), sorted(target - program)
