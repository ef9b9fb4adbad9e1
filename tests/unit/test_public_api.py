"""Every path a user imports or names keeps working, wherever its code lives.

README.md and docs/ name these paths; the package's layout behind them may change (docs/design.md,
"Module map"), these may not. The client a program reports through offers what a Python target's
``RunContext`` offers, or says here why not. The paths that import a framework (the integrations, the
preload strings of the bundled targets) are checked in tests/engine/test_integration_modules.py, the options
``pytest --help`` offers in tests/plugin/test_options_offered.py.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import pytest

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


def test_the_entry_points_name_the_plugin_and_the_bundled_targets():
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("resume-check") == "pytest_resume_check.plugin"
    targets = {ep.name: ep.value for ep in entry_points(group="pytest_resume_check.targets")}
    assert targets.get("builtin") == "pytest_resume_check.builtin.targets:TARGETS"


def public_names(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_client_offers_what_a_run_context_offers():
    from pytest_resume_check.client import Run
    from pytest_resume_check.run import RunContext

    program = public_names(Run())  # inactive: outside the harness; its attributes are set on the instance
    target = public_names(RunContext) | {"plan"}  # properties and methods; plan is set on the instance
    assert program - target == set(ONLY_CLIENT), sorted(program - target)
    assert target - program == set(ONLY_RUN_CONTEXT), sorted(target - program)
