"""This repository's own matrix: the targets the package ships. In any other project they run only
when named (``--resume-matrix-target``); here ``pytest --resume-matrix`` runs them. Each list is empty
when its framework is not installed, and importing them costs nothing (no torch, no verl)."""

from agentlightning.verl.resume_target import TARGETS as AGENTLIGHTNING_TARGETS
from pytest_resume_check.builtin.targets import TARGETS as BUILTIN_TARGETS

pytest_plugins = ["pytester"]

RESUME_TARGETS = [*BUILTIN_TARGETS, *AGENTLIGHTNING_TARGETS]
