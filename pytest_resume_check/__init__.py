"""pytest-resume-check: prove a training job resumed from a checkpoint continues exactly where it stopped.

Public API (imported lazily, so ``import pytest_resume_check`` stays cheap)::

    resume_target, Target, Contract       declare what to run          (targets)
    RunContext, KillSpec                  what a target sees            (run)
    WithIds, ids_of                       attach and read input ids     (ids)
    state_of                              find a trainer's state        (records.state_walk)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees of the lazy exports below (the ``as`` form re-exports them)
    from pytest_resume_check.ids import WithIds as WithIds
    from pytest_resume_check.ids import ids_of as ids_of
    from pytest_resume_check.records.state_walk import state_of as state_of
    from pytest_resume_check.run import KillSpec as KillSpec
    from pytest_resume_check.run import RunContext as RunContext
    from pytest_resume_check.targets import EXACTLY_ONCE as EXACTLY_ONCE
    from pytest_resume_check.targets import EXACTLY_ONCE_ORDERED as EXACTLY_ONCE_ORDERED
    from pytest_resume_check.targets import Contract as Contract
    from pytest_resume_check.targets import Target as Target
    from pytest_resume_check.targets import resume_target as resume_target

_EXPORTS = {
    "resume_target": "pytest_resume_check.targets",
    "Target": "pytest_resume_check.targets",
    "Contract": "pytest_resume_check.targets",
    "EXACTLY_ONCE": "pytest_resume_check.targets",
    "EXACTLY_ONCE_ORDERED": "pytest_resume_check.targets",
    "RunContext": "pytest_resume_check.run",
    "KillSpec": "pytest_resume_check.run",
    "WithIds": "pytest_resume_check.ids",
    "ids_of": "pytest_resume_check.ids",
    "state_of": "pytest_resume_check.records.state_walk",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_resume_check' has no attribute {name!r}")
