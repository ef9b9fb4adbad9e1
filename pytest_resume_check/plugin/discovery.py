"""Which targets a session runs: the project's own, and installed packages' only when named."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_resume_check.records.names import OPT_MATRIX, OPT_TARGET

ERR_NO_PROJECT_TARGETS = ("{opt}: this project declares no resume-check target (resume_target(...) in a "
                          "conftest.py); targets shipped by installed packages run only when named: {known}. "
                          "Declare one (see 'Writing a target' in the docs) or name one with "
                          + OPT_TARGET + "=NAME")
ERR_NO_TARGET = ("{opt}: no resume-check target named {names}; known targets: {known}. Declare targets with "
                 "pytest_resume_check.resume_target in a conftest.py or an entry point")


def discover(config: pytest.Config, wanted: Sequence[str]) -> list[Any]:
    """The targets of this session: the project's own (declared in the conftest.py files pytest loaded),
    or, when named (``wanted``: ``--resume-matrix-target``, ini ``resume_matrix_targets``, the targets of
    the cells named), those names among the project's and the installed packages' (entry points). A
    package's targets never join a project's matrix unasked (an empty folder ran this package's
    self-test cells). The ``pytest_resume_check_targets`` hook may change the list."""
    from pytest_resume_check.plugin.target_sources import entry_point_targets
    from pytest_resume_check.targets import TargetError

    try:
        project = _unique(_conftest_targets(config))
        # Installed packages' targets only when asked for: a broken or clashing package must not stop a
        # project's own matrix.
        needed = (not project) or any(w not in project for w in wanted)
        installed = _unique(entry_point_targets()) if needed else {}
    except TargetError as exc:
        raise pytest.UsageError(str(exc)) from None
    targets = _chosen({**installed, **project}, wanted) if wanted else list(project.values())
    config.hook.pytest_resume_check_targets(config=config, targets=targets)
    if not targets:
        raise pytest.UsageError(ERR_NO_PROJECT_TARGETS.format(opt=OPT_MATRIX, known=", ".join(sorted(installed))
                                                              or "none installed"))
    return targets


def _chosen(everything: dict[str, Any], wanted: Sequence[str]) -> list[Any]:
    """The targets named ``wanted``, each once, in that order."""
    missing = [w for w in wanted if w not in everything]
    if missing:
        raise pytest.UsageError(ERR_NO_TARGET.format(opt=OPT_TARGET, names=", ".join(missing),
                                                     known=", ".join(sorted(everything)) or "none"))
    return [everything[w] for w in dict.fromkeys(wanted)]


def _conftest_targets(config: pytest.Config) -> list[Any]:
    """Targets declared by the conftest modules pytest loaded (they are registered as plugins)."""
    from pytest_resume_check.plugin.target_sources import targets_in_module

    found = []
    for module in config.pluginmanager.get_plugins():
        if getattr(module, "__file__", "").endswith("conftest.py"):
            found.extend(targets_in_module(module))
    return found


def _unique(targets: list[Any]) -> dict[str, Any]:
    """Targets by name; the first of a name wins."""
    unique: dict[str, Any] = {}
    for t in targets:
        unique.setdefault(t.name, t)
    return unique
