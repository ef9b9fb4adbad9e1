"""The pytest side, entry point of the ``pytest11`` plugin ``resume-check``: options, hook specs, the
``resume_check`` fixture, and the matrix session when the matrix is on. Only this package uses pytest.

Its modules: :mod:`.options` (the options and ini keys, their help texts and errors),
:mod:`.settings` (reading them into :class:`~.settings.Settings`), :mod:`.commands` (the commands that
rerun a cell), :mod:`.discovery` (which targets a session runs), :mod:`.items` (the collector and
cells), :mod:`.scheduler` (pytest-xdist), :mod:`.session` (:class:`~.session.MatrixSession`, the hooks
of the matrix), :mod:`.reports` (what the cells' reports carry), :mod:`.summary` (terminal summary,
JSON, HTML and GitHub step summary files), :mod:`.repro` and :mod:`.project_files` (a reproduction
folder per failing cell), :mod:`.cluster` (the matrix on a Ray cluster), :mod:`.environment` (the
runs' environment) and :mod:`.fixtures`. Here live only the hooks needed whether or not the matrix is on.

Loading this plugin imports nothing heavy and only a handful of our modules (the options, the settings,
the fixture, the hook specs and the names they spell; a test counts them): the matrix session and the
engine are imported when ``--resume-matrix`` is given, the engine also when the ``resume_check`` fixture
is used.
"""

from __future__ import annotations

import pytest

# The fixture for hand-written tests lives in its own module; importing it here registers it.
from pytest_resume_check.plugin.fixtures import ResumeCheck, resume_check  # noqa: F401
from pytest_resume_check.plugin.options import HELP_MARKER, add_options
from pytest_resume_check.plugin.settings import SETTINGS_KEY, read_settings

#: The name of the object that hands xdist workers the controller's seed.
XDIST_HANDOFF = "resume_check_xdist"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--resume-matrix…`` options and ``resume_matrix…`` ini keys."""
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The ``pytest_resume_check_…`` hooks other plugins and conftests implement."""
    from pytest_resume_check import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    """Read the settings (the fixture needs them too), and register the matrix session only when the
    matrix is on; with xdist, the seed goes to every worker either way."""
    config.addinivalue_line("markers", HELP_MARKER)
    settings = read_settings(config)
    config.stash[SETTINGS_KEY] = settings
    if settings.mode:
        # Imported only now: the session imports the items, the reports and the summary, which a pytest run
        # that does not use the matrix never needs.
        from pytest_resume_check.plugin.session import PLUGIN_NAME, MatrixSession

        config.pluginmanager.register(MatrixSession(config, settings), PLUGIN_NAME)
    if config.pluginmanager.hasplugin("xdist"):
        from pytest_resume_check.plugin.scheduler import WorkerHandoff

        config.pluginmanager.register(WorkerHandoff(), XDIST_HANDOFF)
