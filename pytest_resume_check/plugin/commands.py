"""The commands that run a cell again with this session's settings: its rerun line, the command of its
reproduction folder, and the arguments of a group's pytest on a cluster node.

Used only with the matrix on (by :mod:`.session`, :mod:`.repro` and :mod:`.cluster`).
"""

from __future__ import annotations

import shlex

import pytest

from pytest_resume_check.plugin.settings import SETTINGS_KEY, Settings
from pytest_resume_check.records.names import (
    OPT_CELL,
    OPT_EXHAUSTIVE,
    OPT_HANG,
    OPT_ISOLATION,
    OPT_MATRIX,
    OPT_MODE,
    OPT_SEED,
    OPT_TARGET,
    QUICK,
)


def rerun_command(config: pytest.Config, name: str) -> str:
    """The command that reruns exactly the cell ``name`` with the same seed (run from the same
    directory): the session's paths, then ``--resume-matrix [--resume-matrix-mode=full]
    --resume-matrix-seed=SEED --resume-matrix-cell=NAME`` and the options that change a cell's result
    (``quick``, the default mode, unsaid)."""
    words = list(config.args) if config.args_source == pytest.Config.ArgsSource.ARGS else []
    return shlex.join(["pytest", *words, *_cell_words(config.stash[SETTINGS_KEY], name)])


def repro_command(config: pytest.Config, name: str, target: str) -> str:
    """The command that reruns the cell ``name`` in its reproduction folder (``--resume-matrix-repro``):
    as :func:`rerun_command`, without the session's paths, and naming the target (``NAME``), so a target
    an installed package ships is found there too."""
    return shlex.join(["pytest", *_cell_words(config.stash[SETTINGS_KEY], name), f"{OPT_TARGET}={target}"])


def group_command(config: pytest.Config, names: list[str]) -> list[str]:
    """The arguments of a pytest that runs exactly the cells ``names`` as this session would (a group's
    pytest on a cluster node): as :func:`rerun_command` for them all, with the outputs this session
    writes itself turned off there (JSON, HTML, reproductions, step summary), no budget, no cache and no
    pytest-xdist."""
    words = list(config.args) if config.args_source == pytest.Config.ArgsSource.ARGS else []
    words += ["-p", "no:cacheprovider", *_cell_words(config.stash[SETTINGS_KEY], *names)]
    for key in ("resume_matrix_json", "resume_matrix_html", "resume_matrix_repro", "resume_matrix_budget",
                "resume_matrix_step_summary", "resume_matrix_ray"):
        words += ["-o", f"{key}="]
    if config.pluginmanager.hasplugin("xdist"):
        words += ["-n", "0"]
    return words


def _cell_words(settings: Settings, *names: str) -> list[str]:
    """The options that select the cells ``names`` and give each the result it had in this session."""
    words = [OPT_MATRIX]
    if settings.mode and settings.mode != QUICK:
        words.append(f"{OPT_MODE}={settings.mode}")
    words += [f"{OPT_SEED}={settings.seed}", *(f"{OPT_CELL}={name}" for name in names)]
    if settings.isolation:
        words.append(f"{OPT_ISOLATION}={settings.isolation}")
    if settings.exhaustive:
        words.append(OPT_EXHAUSTIVE)
    if settings.hang_forced:  # else the ini (or a target) is read again
        words.append(f"{OPT_HANG}={settings.hang_timeout:g}")
    return words


