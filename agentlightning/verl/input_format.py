"""What the input file holds: its entries, format versions, and the checks a decoded payload must pass.

The payload is a dict whose keys are the constants below: the format version, the global step, the
input stream state of :mod:`agentlightning.verl.inputs` (loader state, buffered tail, input epoch, loader
batches taken in that epoch) and, since format version 2, the carried-over groups of
:mod:`agentlightning.verl.inflight` (the original row of every input whose rollouts were still running,
with its id, input epoch and first submission step). Version 1 files (no carried-over groups) are still
read; :class:`InputCheckpoint` says which version a file was.

This module knows nothing of bytes or files: :mod:`agentlightning.verl.input_file` reads and writes
them, and hands the unpickled payload to :func:`validate_payload`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import torch

from agentlightning.verl import inflight
from agentlightning.verl.errors import (
    FIX_OTHER_CHECKPOINT,
    InputCheckpointCorruptError,
    InputCheckpointStepMismatchError,
    InputCheckpointVersionError,
)
from agentlightning.verl.inputs import STATE_KEYS
from agentlightning.verl.value_encoding import decode_value

#: Version 2 added the carried-over groups (KEY_CARRIED_OVER); version 1 files are still read.
INPUT_STATE_FORMAT_VERSION = 2
SUPPORTED_INPUT_STATE_FORMAT_VERSIONS = (1, 2)
#: The first version that records carried-over (in-flight) groups.
CARRIED_OVER_SINCE_VERSION = 2

KEY_FORMAT_VERSION = "format_version"
KEY_GLOBAL_STEP = "global_step"
KEY_INPUT_STREAM = "input_stream"
KEY_CARRIED_OVER = "carried_over"
#: Optional entry: ``"sha256"`` when the zip comment holds the file's checksum (see input_file).
KEY_INTEGRITY = "integrity"
INTEGRITY_SHA256 = "sha256"


@dataclass(frozen=True)
class InputCheckpoint:
    """A decoded input file: its path, format version, step, stream state and carried-over groups.

    ``carried_over`` is the :class:`~agentlightning.verl.inflight.InFlightInputs` state, or None for a
    version 1 file, which did not record in-flight inputs.
    """

    path: str
    format_version: int
    global_step: int
    stream: dict[str, Any]
    carried_over: dict[str, Any] | None

    @property
    def records_carried_over(self) -> bool:
        """True when the file says which inputs were in flight (format version 2 and later)."""
        return self.carried_over is not None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_payload(path: str, payload: Any, expected_step: int | None, checksummed: bool) -> InputCheckpoint:
    """The :class:`InputCheckpoint` of an unpickled ``payload`` read from ``path``, or the typed error
    that says what is wrong with it.

    ``checksummed``: the file's bytes carried a checksum that matched (a payload declaring one must).
    ``expected_step``: the step of the folder holding the file (None: not checked).
    """

    def corrupt(problem: str) -> InputCheckpointCorruptError:
        return InputCheckpointCorruptError(path, problem, FIX_OTHER_CHECKPOINT)

    if not isinstance(payload, dict) or KEY_FORMAT_VERSION not in payload:
        raise InputCheckpointCorruptError(
            path, "is not an agentlightning input checkpoint (no format version)", "Remove the stray file"
        )
    version = payload[KEY_FORMAT_VERSION]
    if not _is_int(version):
        raise corrupt(f"has a format version of type {type(version).__name__}, not int")
    if version not in SUPPORTED_INPUT_STATE_FORMAT_VERSIONS:
        raise InputCheckpointVersionError(path, version, SUPPORTED_INPUT_STATE_FORMAT_VERSIONS)
    missing = _missing_entries(payload, version)
    if missing:
        raise corrupt(f"lacks required entries {missing}")
    if payload.get(KEY_INTEGRITY, INTEGRITY_SHA256) != INTEGRITY_SHA256:
        raise corrupt(f"has an unknown {KEY_INTEGRITY} entry {payload[KEY_INTEGRITY]!r}")
    if KEY_INTEGRITY in payload and not checksummed:
        raise corrupt("declares a checksum but has none (its zip comment was removed)")
    step = payload[KEY_GLOBAL_STEP]
    if not _is_int(step) or step < 0:
        raise corrupt(f"has a global step of type {type(step).__name__} ({step!r}), not a non-negative int")
    if expected_step is not None and step != int(expected_step):
        raise InputCheckpointStepMismatchError(
            path,
            f"records global step {step} but its folder is for step {expected_step}",
            "Do not rename or copy files between global_step folders; resume from the original folder",
        )
    try:
        stream = decode_value(payload[KEY_INPUT_STREAM])
        carried_over = None
        if version >= CARRIED_OVER_SINCE_VERSION:
            carried_over = decode_value(payload[KEY_CARRIED_OVER])
    except Exception as err:  # a tampered numpy record can fail in many ways inside numpy
        raise corrupt(f"holds a malformed numpy record ({type(err).__name__}: {err})") from None
    problem = _stream_problem(stream) or (_carried_over_problem(carried_over, step) if carried_over else None)
    if problem:
        raise corrupt(problem)
    return InputCheckpoint(
        path=path, format_version=version, global_step=step, stream=stream, carried_over=carried_over
    )


def _missing_entries(payload: dict[str, Any], version: int) -> list[str]:
    stream = payload.get(KEY_INPUT_STREAM)
    missing = [KEY_GLOBAL_STEP] if KEY_GLOBAL_STEP not in payload else []
    missing += [key for key in STATE_KEYS if not isinstance(stream, dict) or key not in stream]
    if version >= CARRIED_OVER_SINCE_VERSION:
        groups = payload.get(KEY_CARRIED_OVER)
        missing += [
            f"{KEY_CARRIED_OVER}.{key}"
            for key in inflight.STATE_KEYS
            if not isinstance(groups, dict) or not isinstance(groups.get(key), list)
        ]
    return missing


def _batch_problem(batch: Any, where: str, rows: int | None = None) -> str | None:
    """Why ``batch`` is not a batch (a dict whose tensor, array and list fields share one length; with
    ``rows``, that length), or None."""
    if not isinstance(batch, dict):
        return f"{where} is a {type(batch).__name__}, not a dict of batch fields"
    lengths = set()
    for value in batch.values():
        if isinstance(value, list) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0):
            lengths.add(len(value))
    if len(lengths) > 1:
        return f"{where} has fields of different lengths {sorted(lengths)}"
    if rows is not None and lengths != {rows}:
        return f"{where} holds {sorted(lengths)} inputs, not {rows}"
    return None


def _stream_problem(stream: dict[str, Any]) -> str | None:
    where = KEY_INPUT_STREAM
    if not isinstance(stream.get("loader_state"), dict):
        return f"{where}.loader_state is a {type(stream.get('loader_state')).__name__}, not a dict"
    tail = stream.get("buffered_tail")
    if tail is not None:
        problem = _batch_problem(tail, f"{where}.buffered_tail")
        if problem:
            return problem
    for key in ("input_epoch", "loader_batches_taken_in_epoch"):
        value = stream.get(key)
        if not _is_int(value) or value < 0:
            return f"{where}.{key} is {value!r} ({type(value).__name__}), not a non-negative int"
    return None


def _carried_over_problem(groups: dict[str, Any], step: int) -> str | None:
    where = KEY_CARRIED_OVER
    lengths = {key: len(groups[key]) for key in inflight.STATE_KEYS}
    if len(set(lengths.values())) != 1:
        return f"has carried-over lists of different lengths {lengths}"
    for i, row in enumerate(groups[inflight.STATE_ROWS]):
        problem = _batch_problem(row, f"{where}.rows[{i}]", rows=1)
        if problem:
            return problem
    bounds = {
        inflight.STATE_INPUT_IDS: (None, None),
        inflight.STATE_INPUT_EPOCHS: (0, None),
        inflight.STATE_SUBMITTED_STEPS: (1, step),
    }
    for key, (low, high) in bounds.items():
        for i, value in enumerate(groups[key]):
            if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
                limits = f" in [{low}, {high if high is not None else '...'}]" if low is not None else ""
                return f"{where}.{key}[{i}] is {value!r} ({type(value).__name__}), not an int{limits}"
    return None
