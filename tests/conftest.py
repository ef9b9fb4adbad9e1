"""This repository's own matrix: the targets the package ships. In any other project they run only
when named (``--resume-matrix-target``); here ``pytest --resume-matrix`` runs them. Each list is empty
when its framework is not installed, and importing them costs nothing (no torch, no verl). The Ray
target (seconds per run) is left out here: it runs when named, and in tests/verl/test_ray_workers.py."""

import os
import sys
from pathlib import Path

import pytest

# The helper targets, trainers and programs the tests share live in tests/support, importable by name
# from every wing (unit, engine, plugin, docs, verl); a fork-server or spawn child inherits this path.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

#: Plugins of other packages that pytest loads in every session it starts (hydra-core's and anyio's come with
#: verl's dependencies): about 0.45 s of imports per start, more than pytest's own. The sessions this suite
#: starts (pytester's, the documented commands, their xdist workers: some hundreds) never use them, so they are
#: left out there through PYTEST_ADDOPTS, which those sessions inherit. This session has already loaded them,
#: and the main job (README) loads them. Three plugin test files with -n 2: 49.7 s -> 37.6 s.
UNUSED_PLUGINS = "-p no:hydra_pytest -p no:anyio"
_addopts = os.environ.get("PYTEST_ADDOPTS", "")
if UNUSED_PLUGINS not in _addopts:  # a nested session in this folder has it already
    os.environ["PYTEST_ADDOPTS"] = f"{_addopts} {UNUSED_PLUGINS}".strip()

from agentlightning.verl.resume_target import DEFAULT_TARGETS as AGENTLIGHTNING_TARGETS  # noqa: E402
from pytest_resume_check.builtin.targets import TARGETS as BUILTIN_TARGETS  # noqa: E402

pytest_plugins = ["pytester"]

RESUME_TARGETS = [*BUILTIN_TARGETS, *AGENTLIGHTNING_TARGETS]


@pytest.fixture(autouse=True)
def _no_step_summary_in_nested_sessions(monkeypatch):
    """The pytest sessions the tests start must not append to the real GitHub step summary of a CI job
    that runs this suite (they inherit the environment); the tests of the step summary set it themselves."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
