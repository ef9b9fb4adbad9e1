"""The runs' environment as the session sees it (docs/cluster.md, "The runs' environment"): which variables
are declared for a target (its ``pass_env=``, ``--resume-matrix-env``, a command target's ``env=``), the
values a Ray node gets for them, the warning for variables a node's runs read with another value than this
machine has, the ``declared`` and ``differs`` names of a cell's JSON, and what a reproduction records.

The rule for which variables count, and the comparison without values, are
:mod:`pytest_resume_check.records.environ`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import pytest

from pytest_resume_check.plugin.settings import Settings
from pytest_resume_check.records.environ import forwarded
from pytest_resume_check.records.names import OPT_ENV

if TYPE_CHECKING:
    from pytest_resume_check.records.cell_json import CellJson

#: The warning of a cell whose runs on a Ray node read variables this machine has otherwise. The same text
#: for every cell with the same names, so pytest's warnings summary shows it once, above those cells.
MSG_DIFFERS = ("resume-check: runs on the Ray cluster read environment variables that differ between this "
               "machine and their node (another value, or set on one side only): {names}; the verdicts of those "
               "cells may not hold here. Forward them to the nodes with " + OPT_ENV + "={joined} (or pass_env= "
               "on the target), or set them alike on the nodes")
#: Keys of a cell's JSON ``environment`` the plugin adds to the runs' (``read``, ``harness``).
DECLARED_KEY: Final = "declared"
DIFFERS_KEY: Final = "differs"


class EnvironmentDiffersWarning(pytest.PytestWarning):
    """A cell ran on a Ray node whose environment differs from this machine's in variables its runs read
    (``-W error::pytest_resume_check.plugin.environment.EnvironmentDiffersWarning`` fails such cells)."""


def differs_message(names: Iterable[str]) -> str:
    """:data:`MSG_DIFFERS` for ``names``."""
    names = sorted(names)
    return MSG_DIFFERS.format(names=", ".join(names), joined=",".join(names))


def passed(target: Any, settings: Settings) -> tuple[str, ...]:
    """The variables ``target``'s runs take from this environment: its ``pass_env=``, then
    ``--resume-matrix-env``'s."""
    return tuple(dict.fromkeys([*getattr(target, "pass_env", ()), *settings.env]))


def set_by_target(target: Any) -> dict[str, str]:
    """The variables a command target's ``env=`` sets on every run (the harness sets them anywhere)."""
    command = getattr(target, "command", None)
    return dict(command.env) if command is not None else {}


def declared(target: Any, settings: Settings) -> list[str]:
    """Every variable declared for ``target``'s runs, sorted."""
    return sorted({*passed(target, settings), *set_by_target(target)})


def for_node(target: Any, settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """What a Ray node sets for ``target``'s runs: each passed variable's value here (None: unset there too)."""
    return forwarded(passed(target, settings), os.environ if environ is None else environ)


def annotate(cell_json: CellJson, target: Any, settings: Settings, differs: Iterable[str] | None = None) -> None:
    """Add the declared names to a cell's JSON ``environment`` and, for a cell run on a node, the names that
    differ there (names only: values stay out of reports)."""
    environment = cell_json.setdefault("environment", {})
    environment[DECLARED_KEY] = declared(target, settings)
    if differs is not None:
        environment[DIFFERS_KEY] = sorted(differs)


def for_repro(target: Any, settings: Settings, cell_json: Mapping[str, Any],
              environ: Mapping[str, str] | None = None) -> Any:
    """The :class:`~pytest_resume_check.report.repro.Environment` a failing cell's reproduction records: the
    passed variables with their values here, a command target's ``env=``, the other variables its runs read
    (names only) and those the harness set."""
    from pytest_resume_check.report.repro import Environment

    environment = cell_json.get("environment") or {}
    known = {*passed(target, settings), *set_by_target(target)}
    return Environment(passed=for_node(target, settings, environ), set_by_target=set_by_target(target),
                       read=[n for n in environment.get("read", ()) if n not in known],
                       harness=list(environment.get("harness", ())))
