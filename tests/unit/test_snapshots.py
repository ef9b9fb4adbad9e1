"""The shared first run's snapshots of its checkpoint folder: a file that did not change since
the previous snapshot is linked to that snapshot's copy, so a group's snapshots hold each checkpoint's
bytes once; a cell that takes a snapshot over owns every file before its runs may write in place."""

from __future__ import annotations

import os
from pathlib import Path

from pytest_resume_check.cells.shared_runs import _Copy, _own_files, _snapshot


def _inodes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_ino for p in folder.rglob("*") if p.is_file()}


def _bytes_on_disk(*folders: Path) -> int:
    seen = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                seen[path.stat().st_ino] = path.stat().st_size
    return sum(seen.values())


def _save(live: Path, step: int) -> None:
    folder = live / f"step_{step}"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes([step]) * 10_000)
    (live / "latest").write_text(str(step))


def test_checkpoints_kept_from_one_snapshot_to_the_next_are_linked_not_copied(tmp_path):
    live, seen = tmp_path / "live", {}
    live.mkdir()
    for step in (1, 2, 3, 4):
        _save(live, step)
        _snapshot(live, tmp_path / f"snap{step}", seen)
    first, last = _inodes(tmp_path / "snap1"), _inodes(tmp_path / "snap4")
    assert first["step_1/weights.bin"] == last["step_1/weights.bin"]
    assert first["latest"] != last["latest"]  # rewritten at every step
    assert (tmp_path / "snap1" / "latest").read_text() == "1" and (tmp_path / "snap4" / "latest").read_text() == "4"
    snaps = [tmp_path / f"snap{s}" for s in (1, 2, 3, 4)]
    assert _bytes_on_disk(*snaps) < 5 * 10_000  # four checkpoints once (a copy per pause held ten)


def test_a_file_rewritten_in_place_with_its_old_size_and_time_is_copied_again(tmp_path):
    """The file clock ticks coarsely: a rewrite soon after a snapshot can keep size and time."""
    live, seen = tmp_path / "live", {}
    live.mkdir()
    (live / "pointer").write_text("step_2")
    _snapshot(live, tmp_path / "a", seen)
    before = os.stat(live / "pointer")
    (live / "pointer").write_text("step_4")
    os.utime(live / "pointer", ns=(before.st_atime_ns, before.st_mtime_ns))
    _snapshot(live, tmp_path / "b", seen)
    assert (tmp_path / "a" / "pointer").read_text() == "step_2"
    assert (tmp_path / "b" / "pointer").read_text() == "step_4"


def test_times_modes_and_links_are_kept_as_a_kill_would_leave_them(tmp_path):
    live, seen = tmp_path / "live", {}
    live.mkdir()
    _save(live, 1)
    _save(live, 2)
    os.utime(live / "step_1", ns=(1_000_000_000, 1_000_000_000))
    os.utime(live / "step_2", ns=(2_000_000_000, 2_000_000_000))
    (live / "newest").symlink_to("step_2")
    os.chmod(live / "latest", 0o600)
    _snapshot(live, tmp_path / "snap", seen)
    snap = tmp_path / "snap"
    assert os.stat(snap / "step_1").st_mtime_ns < os.stat(snap / "step_2").st_mtime_ns  # sort by time still works
    assert os.readlink(snap / "newest") == "step_2"
    assert os.stat(snap / "latest").st_mode & 0o777 == 0o600
    assert isinstance(seen["step_2/weights.bin"], _Copy)


def test_a_cell_owns_its_snapshot_before_its_runs_write_in_place(tmp_path):
    live, seen = tmp_path / "live", {}
    live.mkdir()
    _save(live, 1)
    _snapshot(live, tmp_path / "snap1", seen)
    _snapshot(live, tmp_path / "snap2", seen)
    cell = tmp_path / "cell"
    os.replace(tmp_path / "snap1", cell)
    _own_files(cell)
    with open(cell / "step_1" / "weights.bin", "r+b") as out:  # a resumed run rewriting in place
        out.write(b"x" * 10_000)
    assert (tmp_path / "snap2" / "step_1" / "weights.bin").read_bytes() == bytes([1]) * 10_000
    assert os.stat(tmp_path / "snap2" / "step_1" / "weights.bin").st_nlink == 1
