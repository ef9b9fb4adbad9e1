"""This repository's own matrix: the targets the package ships. In any other project they run only
when named (``--resume-matrix-target``); here ``pytest --resume-matrix`` runs them. Each list is empty
when its framework is not installed, and importing them costs nothing (no torch, no verl). The Ray
target (seconds per run) is left out here: it runs when named, and in tests/verl/test_ray_workers.py."""

from agentlightning.verl.resume_target import DEFAULT_TARGETS as AGENTLIGHTNING_TARGETS
from pytest_resume_check.builtin.targets import TARGETS as BUILTIN_TARGETS

pytest_plugins = ["pytester"]

RESUME_TARGETS = [*BUILTIN_TARGETS, *AGENTLIGHTNING_TARGETS]
