"""Declares the trainer of trainer.py as a resume-check target.

``pytest --resume-matrix`` turns every (case, resume mode, kill point) of it into a test item.
"""

from __future__ import annotations

import pytest
import trainer

from pytest_resume_check import resume_target

regression = resume_target(
    trainer.train,
    name="regression",
    # The matrix needs the step count of an uninterrupted run before any run starts.
    steps=trainer.total_steps,
    # Kill points beside an epoch's last step are where loaders go wrong: always sample them.
    boundaries=trainer.epoch_boundaries,
    # 10 inputs in batches of 4: three steps per epoch, the last one short.
    cases=[
        {"id": "e2", "epochs": 2, "shuffle": False},
        {"id": "e2-shuffle", "epochs": 2, "shuffle": True},
    ],
    # Every input once per epoch, in the same order as the uninterrupted run.
    contract="exactly_once_ordered",
    # Imported (and the warm-up run) once in the fork server that every run forks from.
    preload=("torch", "torchdata.stateful_dataloader", "trainer:warm_up"),
)


@pytest.fixture
def regression_target():
    """The target, for hand-written tests with the ``resume_check`` fixture (see test_by_hand.py)."""
    return regression
