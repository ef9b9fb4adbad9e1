"""Recorded saves kept for a session's other xdist workers (``process.shared_saves``): a save recorded once is
read, not recorded again, by another worker that shares the folder; a failure is never kept for the others
and is raised again, not recorded twice, in the process that met it; a kept file of another format or save
is recorded again."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pytest_resume_check.plugin import worker_saves
from pytest_resume_check.process.shared_saves import SharedSaves, rotated, worker_folder
from pytest_resume_check.records.faults import COLLECTIVE, FileOp

OPS = [FileOp(1, "mkdir", "s2", None, 0, None), FileOp(2, COLLECTIVE, "barrier", None, 0, None),
       FileOp(1, "rename", "s2/a.tmp", "s2/a", 1, 1)]


def recorder(calls: list[str], ops: list[FileOp] = OPS):
    def record() -> list[FileOp]:
        calls.append("recorded")
        return list(ops)
    return record


def test_a_save_recorded_by_one_worker_is_read_by_another(tmp_path):
    """Two engines' stores over one folder, as two workers' (each a store of its own, its lock taken on a
    file opened by itself)."""
    calls: list[str] = []
    assert SharedSaves(tmp_path).get("t\0c\x002\x000", recorder(calls)) == OPS
    other_calls: list[str] = []
    assert SharedSaves(tmp_path).get("t\0c\x002\x000", recorder(other_calls, [])) == OPS
    assert (calls, other_calls) == (["recorded"], [])


def test_one_process_records_a_save_once():
    calls: list[str] = []
    saves = SharedSaves()
    assert saves.get("k", recorder(calls)) == saves.get("k", recorder(calls)) == OPS
    assert calls == ["recorded"]


def test_a_failed_recording_is_raised_again_in_its_process_and_recorded_again_by_another(tmp_path):
    calls: list[str] = []

    def failing() -> list[FileOp]:
        calls.append("failed")
        raise RuntimeError("recording the save of step 2 of t failed")

    saves = SharedSaves(tmp_path)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="step 2 of t failed"):
            saves.get("k", failing)
    assert calls == ["failed"]
    assert SharedSaves(tmp_path).get("k", recorder(calls)) == OPS and calls == ["failed", "recorded"]


@pytest.mark.parametrize("damage", ["not json", json.dumps({"version": 0, "key": "k", "ops": []}),
                                    json.dumps({"version": 1, "key": "other", "ops": []}),
                                    json.dumps({"version": 1, "key": "k", "ops": [[1, 2, 3, 4, 5, 6, 7]]}),
                                    json.dumps({"version": 1, "key": "k"})])
def test_a_kept_file_of_another_format_or_save_is_recorded_again(tmp_path, damage):
    SharedSaves(tmp_path).get("k", recorder([]))
    (kept,) = tmp_path.glob("*.json")
    kept.write_text(damage)
    calls: list[str] = []
    assert SharedSaves(tmp_path).get("k", recorder(calls)) == OPS and calls == ["recorded"]


def test_each_worker_starts_at_its_own_share_and_takes_every_save():
    saves = ["a", "b", "c", "d", "e"]
    orders = [rotated(saves, worker, 2) for worker in range(2)]
    assert orders == [["a", "b", "c", "d", "e"], ["c", "d", "e", "a", "b"]]
    assert rotated(saves, 0, 1) == saves and rotated([], 1, 2) == []


def test_the_workers_folder_is_in_the_controllers_base_temporary_folder(tmp_path):
    assert worker_folder(tmp_path / "bt" / "popen-gw1", "abc") == tmp_path / "bt" / "resume-matrix-saves-abc"


def config(workerinput=None, collectonly=False):
    cfg = SimpleNamespace(option=SimpleNamespace(collectonly=collectonly))
    if workerinput is not None:
        cfg.workerinput = workerinput
    return cfg


def test_an_xdist_worker_records_from_its_own_share_on_and_a_failing_target_does_not_stop_the_others():
    seen: list[str] = []

    def record(target: str) -> None:
        seen.append(target)
        if target == "c":
            raise RuntimeError("recording failed")  # raised again where its items are made

    second = config({"workerid": "gw1", "workercount": 2, "testrunuid": "x"})
    assert worker_saves.worker_share(second) == (1, 2)
    worker_saves.record_in_turn(second, ["a", "b", "c", "d"], record)
    assert seen == ["c", "d", "a", "b"]


def test_without_xdist_or_under_collect_only_nothing_is_recorded_ahead():
    seen: list[str] = []
    assert worker_saves.worker_share(config()) == (0, 1)
    worker_saves.record_in_turn(config(), ["a"], seen.append)
    worker_saves.record_in_turn(config({"workerid": "gw0", "workercount": 2}, collectonly=True), ["a"], seen.append)
    assert seen == []
    assert worker_saves.shared_saves(config()).folder is None
