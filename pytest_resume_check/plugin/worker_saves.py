"""The crash cells' saves in the xdist workers of a session: each recorded by one worker and read by the others
(:mod:`pytest_resume_check.process.shared_saves`), every worker starting at its own share of the targets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pytest_resume_check.process.shared_saves import SharedSaves, rotated, worker_folder


def worker_share(config: pytest.Config) -> tuple[int, int]:
    """This xdist worker's index and the number of workers; ``(0, 1)`` without xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return 0, 1
    try:
        return int(str(workerinput["workerid"]).lstrip("gw")), int(workerinput["workercount"])
    except (KeyError, ValueError):
        return 0, 1


def shared_saves(config: pytest.Config) -> SharedSaves:
    """The session's recorded saves, kept for its other xdist workers when it has some."""
    workerinput = getattr(config, "workerinput", None)
    factory = getattr(config, "_tmp_path_factory", None)
    if workerinput is None or factory is None or "testrunuid" not in workerinput:
        return SharedSaves()
    return SharedSaves(worker_folder(factory.getbasetemp(), str(workerinput["testrunuid"])))


def record_in_turn(config: pytest.Config, targets: Sequence[Any], record: Callable[[Any], object]) -> None:
    """In an xdist worker (not under ``--co``), ``record`` each target's save starting at this worker's share of
    ``targets``, so the workers record different saves at once and read the others'. A target whose ``record``
    raises is skipped: it raises again, with its message, where the target's items are made."""
    worker, workers = worker_share(config)
    if workers <= 1 or config.option.collectonly:
        return
    for target in rotated(targets, worker, workers):
        try:
            record(target)
        except Exception:  # said where the target's items are made
            continue
