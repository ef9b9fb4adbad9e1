"""Targets of the built-in loop, registered through the ``pytest_resume_check.targets`` entry point."""

from __future__ import annotations

from pytest_resume_check.builtin import loop
from pytest_resume_check.targets import resume_target

#: Cases of the built-in loop: loader batch vs take size equal, dividing, not dividing and larger;
#: shuffle off and on; one and two epochs; 0 and 2 loader workers.
CASES = (
    {"id": "b4-take4-e2", "batch": 4, "take": 4, "epochs": 2},
    {"id": "b4-take2-e2-shuffle", "batch": 4, "take": 2, "epochs": 2, "shuffle": True},
    {"id": "b4-take3-e2-shuffle-w2", "batch": 4, "take": 3, "epochs": 2, "shuffle": True, "workers": 2},
    {"id": "b4-take6-e1", "batch": 4, "take": 6, "epochs": 1},
)

builtin_loop = resume_target(
    loop.correct_loop,
    name="builtin_loop",
    steps=loop.total_steps,
    boundaries=loop.epoch_boundaries,
    buffered=loop.buffered_steps,
    cases=CASES,
    contract="exactly_once_ordered",
    preload=("torch", "torchdata.stateful_dataloader", "pytest_resume_check.builtin.loop:warm_up"),
    description="plain PyTorch loop over StatefulDataLoader with a buffered tail",
    crash_save=(2, 1),
)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("torchdata") is not None


#: Only offered where torch and torchdata are installed.
TARGETS = [builtin_loop] if _has_torch() else []
