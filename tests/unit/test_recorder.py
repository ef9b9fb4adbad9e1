"""The child-side recorder of a save's file operations: what each injected fault leaves on disk.

Pure Python (no torch): the recorder wraps ``open``, ``os`` and ``shutil`` functions in this process
for the duration of a ``with`` block.
"""

from __future__ import annotations

import builtins
import errno
import gc
import os

import pytest

from pytest_resume_check.child.recorder import Recorder
from pytest_resume_check.records.faults import MODE_CRASH, MODE_ERROR, MODE_RECORD, FaultPlan


class Killed(Exception):
    pass


def _kill(text, extra):
    raise Killed(text)


def _save(root, step="2"):
    """A tracker written the way stock verl writes it: open('w'), one write, close, no fsync."""
    with open(root / "tracker.txt", "w") as f:
        f.write(step)


def _watched(plan, root):
    rec = Recorder(plan, str(root), lambda op: None, _kill)
    rec.start(plan.step)
    return rec


def test_recording_lists_each_file_operation_in_order(tmp_path):
    with _watched(FaultPlan(2, MODE_RECORD), tmp_path) as rec:
        _save(tmp_path)
    assert [(op.kind, op.path) for op in rec.ops] == [
        ("open", "tracker.txt"), ("write", "tracker.txt"), ("close", "tracker.txt")]


def test_uninstall_puts_the_real_functions_back(tmp_path):
    real = (builtins.open, os.replace, os.fsync)
    with _watched(FaultPlan(2, MODE_RECORD), tmp_path):
        assert builtins.open is not real[0]
    assert (builtins.open, os.replace, os.fsync) == real


@pytest.mark.parametrize("collect", [False, True], ids=["gc-off", "gc-on"])
def test_an_error_at_close_loses_the_buffered_bytes_whatever_the_garbage_collector_does(tmp_path, collect):
    # Once, the abandoned file object flushed its buffer only if it was collected in time.
    (tmp_path / "tracker.txt").write_text("1")
    gc.disable()
    try:
        with _watched(FaultPlan(2, MODE_ERROR, 2, errno.ENOSPC), tmp_path), pytest.raises(OSError, match="injected"):
            _save(tmp_path)
        if collect:
            gc.collect()
        assert (tmp_path / "tracker.txt").read_text() == ""
    finally:
        gc.enable()


def test_an_error_at_write_leaves_the_file_truncated_and_closed_normally(tmp_path):
    with _watched(FaultPlan(2, MODE_ERROR, 1, errno.EIO), tmp_path) as rec, pytest.raises(OSError):
        _save(tmp_path)
    assert (tmp_path / "tracker.txt").read_text() == ""
    assert [op.kind for op in rec.ops] == ["open", "write", "close"]


def test_a_crash_point_stops_before_its_operation(tmp_path):
    with _watched(FaultPlan(2, MODE_CRASH, 1), tmp_path) as rec:
        f = open(tmp_path / "tracker.txt", "w")
        with pytest.raises(Killed, match="before write"):
            f.write("2")
        assert [op.kind for op in rec.ops] == ["open"]
        rec.active = False  # the kill ended the watched save; closing is no op of it
        f.close()
