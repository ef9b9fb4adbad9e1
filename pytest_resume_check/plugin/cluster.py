"""The matrix session's side of ``--resume-matrix-ray`` (docs/cluster.md): connecting before the session's
header (which names the cluster), grouping the cells to run into tasks with the variables their runs take
from here and starting them (:mod:`pytest_resume_check.cluster.executor`), and, in a group's pytest on a
node, writing each cell's record for the task that started it, with digests of the variables its runs read
(:mod:`pytest_resume_check.cluster.wire`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_resume_check.cluster import wire
from pytest_resume_check.plugin import environment
from pytest_resume_check.plugin.commands import group_command
from pytest_resume_check.plugin.settings import Settings
from pytest_resume_check.records.environ import digests
from pytest_resume_check.records.names import OPT_RAY, OPT_RAY_COPY, OPT_RAY_RETRIES, REFERENCE


def connect(settings: Settings, root: Path) -> Any:
    """Connect to the cluster (before the session's header, which names it); ``pytest.UsageError`` when it
    cannot be used."""
    from pytest_resume_check.cluster import executor as ex

    assert settings.ray is not None
    runner = ex.RayExecutor(ex.Settings(settings.ray, settings.ray_retries, settings.ray_copy_bytes, OPT_RAY,
                                        OPT_RAY_RETRIES, OPT_RAY_COPY), root)
    try:
        runner.connect()
    except ex.ClusterError as exc:
        runner.close()
        raise pytest.UsageError(str(exc)) from None
    return runner


def start(runner: Any, config: pytest.Config, settings: Settings, items: list[Any]) -> None:
    """Submit one task per group of ``items`` (target, case, resume mode), each asking its target's
    resources and setting the variables its runs take from here; ``pytest.UsageError`` when the cluster
    cannot be used."""
    from pytest_resume_check.cluster import executor as ex
    from pytest_resume_check.targets import run_resources

    groups: dict[str, list[Any]] = {}
    for item in items:
        cell = item.cell
        groups.setdefault(f"{cell.target.name} {cell.case_id} {cell.resume_mode}", []).append(item)
    try:
        runner.start([(label, [i.name for i in members], run_resources(members[0].cell.target),
                       group_command(config, [i.name for i in members]),
                       environment.for_node(members[0].cell.target, settings))
                      for label, members in groups.items()],
                     cwd=str(config.invocation_params.dir))
    except ex.ClusterError as exc:
        raise pytest.UsageError(str(exc)) from None


def write_record(item: Any, call: pytest.CallInfo[None], report: pytest.TestReport, root: Path) -> None:
    """In a group's pytest on a node: the cell's outcome, for the task that reads it (nothing elsewhere)."""
    path = wire.stream_path()
    if path is None:
        return
    from pytest_resume_check.plugin.items import ResumeCheckFailure
    from pytest_resume_check.report.text import ENVIRONMENT_KEY, kept_line

    excinfo = call.excinfo
    kept: list[str] = []
    line = ""
    if excinfo is None:
        outcome, text = wire.PASSED, ""
    elif excinfo.errisinstance(pytest.skip.Exception):
        outcome, text = wire.SKIPPED, str(getattr(excinfo.value, "msg", excinfo.value))
    elif excinfo.errisinstance(ResumeCheckFailure):
        outcome, text = wire.FAILED, str(excinfo.value)
        workdir = item.result.workdir if item.result is not None else None
        if workdir is not None:
            kept, line = [str(workdir), str(workdir.parent / REFERENCE)], kept_line(workdir)
    else:
        outcome, text = wire.ERROR, report.longreprtext
    cell_json = item.cell_json
    read = ((cell_json or {}).get(ENVIRONMENT_KEY) or {}).get("read") or []
    key = wire.env_key()
    wire.write(path, {"name": item.name, "outcome": outcome, "text": text, "cell_json": cell_json,
                      "reference_seconds": item.reference_seconds, "root": str(root), "kept": kept,
                      "kept_line": line,
                      "environ": digests(read, key, os.environ) if key else {}})
