"""The shared first run's snapshots of its checkpoint folder: a file is cloned or linked to the run's live
file where the file system allows it, proved unchanged once the run has ended; else copied, and a copy
that did not change by the next snapshot is linked to it, so a group's snapshots hold each checkpoint's
bytes once; a cell that takes a snapshot over owns every file it cannot borrow before its runs may write in
place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytest_resume_check.cells.snapshots import (
    KIND_REWRITTEN,
    LINK_MIN_BYTES,
    Copy,
    LiveLinks,
    links_inside,
    own_files,
    take_snapshot,
)

#: A checkpoint blob: big enough that a snapshot holds it as a link to the live file rather than a copy.
BIG = LINK_MIN_BYTES


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
    (folder / "weights.bin").write_bytes(bytes([step]) * BIG)
    (live / "latest").write_text(str(step))


def test_checkpoints_kept_from_one_snapshot_to_the_next_are_linked_not_copied(tmp_path):
    live, seen = tmp_path / "live", {}
    live.mkdir()
    for step in (1, 2, 3, 4):
        _save(live, step)
        take_snapshot(live, tmp_path / f"snap{step}", seen)
    first, last = _inodes(tmp_path / "snap1"), _inodes(tmp_path / "snap4")
    assert first["step_1/weights.bin"] == last["step_1/weights.bin"]
    assert first["latest"] != last["latest"]  # rewritten at every step
    assert (tmp_path / "snap1" / "latest").read_text() == "1" and (tmp_path / "snap4" / "latest").read_text() == "4"
    snaps = [tmp_path / f"snap{s}" for s in (1, 2, 3, 4)]
    assert _bytes_on_disk(*snaps) < 5 * BIG  # four checkpoints once (a copy per pause held ten)


def test_a_file_rewritten_in_place_with_its_old_size_and_time_is_copied_again(tmp_path):
    """The file clock ticks coarsely: a rewrite soon after a snapshot can keep size and time."""
    live, seen = tmp_path / "live", {}
    live.mkdir()
    (live / "pointer").write_text("step_2")
    take_snapshot(live, tmp_path / "a", seen)
    before = os.stat(live / "pointer")
    (live / "pointer").write_text("step_4")
    os.utime(live / "pointer", ns=(before.st_atime_ns, before.st_mtime_ns))
    take_snapshot(live, tmp_path / "b", seen)
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
    take_snapshot(live, tmp_path / "snap", seen)
    snap = tmp_path / "snap"
    assert os.stat(snap / "step_1").st_mtime_ns < os.stat(snap / "step_2").st_mtime_ns  # sort by time still works
    assert os.readlink(snap / "newest") == "step_2"
    assert os.stat(snap / "latest").st_mode & 0o777 == 0o600
    assert isinstance(seen["step_2/weights.bin"], Copy)


def test_a_cell_owns_its_snapshot_before_its_runs_write_in_place(tmp_path):
    live, seen = tmp_path / "live", {}
    live.mkdir()
    _save(live, 1)
    take_snapshot(live, tmp_path / "snap1", seen)
    take_snapshot(live, tmp_path / "snap2", seen)
    cell = tmp_path / "cell"
    os.replace(tmp_path / "snap1", cell)
    own_files(cell)
    with open(cell / "step_1" / "weights.bin", "r+b") as out:  # a resumed run rewriting in place
        out.write(b"x" * BIG)
    assert (tmp_path / "snap2" / "step_1" / "weights.bin").read_bytes() == bytes([1]) * BIG
    assert os.stat(tmp_path / "snap2" / "step_1" / "weights.bin").st_nlink == 1


def _taken(live: Path, dest: Path, links: LiveLinks, step: int) -> None:
    """One snapshot as a shared first run takes it: then the run goes on past the file clock's tick."""
    links.step = step
    take_snapshot(live, dest, {}, links)
    links.past_the_tick(dest.parent)


def _save_aside(live: Path, step: int) -> None:
    """:func:`_save`, the pointer written aside and renamed over the old one (a new file, not a rewrite)."""
    folder = live / f"step_{step}"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes([step]) * BIG)
    (live / "latest.tmp").write_text(str(step))
    os.replace(live / "latest.tmp", live / "latest")


def test_a_file_the_run_leaves_alone_is_held_without_a_copy(tmp_path):
    live, links = tmp_path / "live", LiveLinks()
    live.mkdir()
    _save_aside(live, 1)
    _taken(live, tmp_path / "snap1", links, 1)
    _save_aside(live, 2)
    _taken(live, tmp_path / "snap2", links, 2)
    if links.clones:  # a file system that clones: no bytes copied, no link needed
        assert links.links == 0
    else:  # the snapshots hold the live inode itself, once
        assert _inodes(tmp_path / "snap1")["step_1/weights.bin"] == _inodes(live)["step_1/weights.bin"]
        assert _inodes(tmp_path / "snap2")["step_1/weights.bin"] == _inodes(live)["step_1/weights.bin"]
    assert (tmp_path / "snap1" / "latest").read_text() == "1" and (tmp_path / "snap2" / "latest").read_text() == "2"
    assert links.check() == {}


def test_a_file_rewritten_in_place_after_its_snapshot_makes_that_snapshot_unusable(tmp_path):
    """The planted case: the bytes a snapshot's link shows are no longer what a kill there left, and the
    rewrite keeps the file's size and modification time: only the change time and the bytes tell."""
    live, links = tmp_path / "live", LiveLinks()
    live.mkdir()
    (live / "model.bin").write_bytes(b"2" * BIG)
    _taken(live, tmp_path / "a", links, 2)
    if links.clones:
        pytest.skip("this file system clones: a snapshot never shares the run's inode")
    before = os.stat(live / "model.bin")
    (live / "model.bin").write_bytes(b"4" * BIG)
    os.utime(live / "model.bin", ns=(before.st_atime_ns, before.st_mtime_ns))
    _taken(live, tmp_path / "b", links, 4)
    broken = links.check()
    assert list(broken) == [2] and (broken[2].rel, broken[2].kind) == ("model.bin", KIND_REWRITTEN)
    # From then on the file is copied: the later snapshot keeps its bytes whatever the run does next.
    (live / "model.bin").write_bytes(b"6" * BIG)
    assert (tmp_path / "b" / "model.bin").read_bytes() == b"4" * BIG
    assert links.check() == broken


def test_a_small_file_the_run_rewrites_or_appends_to_in_place_is_copied_and_its_snapshot_stays_usable(tmp_path):
    """Logs, pointers and trackers are small and written in place at every step: a snapshot copies them, so
    the run's next write neither reaches it nor leaves it unusable; only a big file is linked."""
    live, links = tmp_path / "live", LiveLinks()
    live.mkdir()
    (live / "latest").write_text("step_2")
    (live / "train.log").write_text("step 1\nstep 2\n")
    (live / "model.bin").write_bytes(b"2" * BIG)
    _taken(live, tmp_path / "a", links, 2)
    (live / "latest").write_text("step_4")
    with open(live / "train.log", "a") as log:
        log.write("step 3\nstep 4\n")
    _taken(live, tmp_path / "b", links, 4)
    assert links.check() == {}
    assert (tmp_path / "a" / "latest").read_text() == "step_2"
    assert (tmp_path / "a" / "train.log").read_text() == "step 1\nstep 2\n"
    assert os.stat(tmp_path / "a" / "latest").st_ino != os.stat(live / "latest").st_ino
    if not links.clones:
        assert links.links == 2  # model.bin, once in each snapshot
        assert os.stat(tmp_path / "a" / "model.bin").st_ino == os.stat(live / "model.bin").st_ino


def test_a_file_the_run_deletes_after_its_snapshot_leaves_that_snapshot_usable(tmp_path):
    """Deleting an old checkpoint moves the change time of the inode the snapshot holds; its bytes decide."""
    live, links = tmp_path / "live", LiveLinks()
    live.mkdir()
    _save(live, 1)
    _taken(live, tmp_path / "snap1", links, 1)
    (live / "step_1" / "weights.bin").unlink()
    assert links.check() == {}
    assert (tmp_path / "snap1" / "step_1" / "weights.bin").read_bytes() == bytes([1]) * BIG


def test_a_file_lent_to_a_cell_is_left_shared_and_the_others_are_owned(tmp_path):
    live, links = tmp_path / "live", LiveLinks()
    live.mkdir()
    _save(live, 1)
    _taken(live, tmp_path / "snap1", links, 1)
    _taken(live, tmp_path / "snap2", links, 2)
    shutil.rmtree(live)
    cell = tmp_path / "cell"
    os.replace(tmp_path / "snap1", cell)
    lent = own_files(cell, lambda info, discarded: info.st_size == BIG)
    assert [os.path.relpath(path, cell) for path, _ in lent] == (["step_1/weights.bin"] if links.links else [])
    assert os.stat(cell / "latest").st_nlink == 1  # shared, not lendable: made the cell's own


def test_a_file_whose_other_links_are_all_in_folders_being_deleted_is_neither_copied_nor_lent(tmp_path):
    """A passed cell's folder goes to the trash and is deleted in the background: the next cell shares
    checkpoint files with it meanwhile, which nothing reads again, so they cost no copy; a link anywhere else
    (a failing cell's kept folder) still makes the cell's file its own."""
    cell, trash, kept = tmp_path / "cell", tmp_path / "trash", tmp_path / "kept"
    for folder in (cell, trash, kept):
        folder.mkdir()
    (cell / "model.bin").write_bytes(b"m" * 100)
    (cell / "optim.bin").write_bytes(b"o" * 100)
    os.link(cell / "model.bin", trash / "model.bin")
    os.link(cell / "model.bin", trash / "evidence.bin")
    os.link(cell / "optim.bin", trash / "optim.bin")
    os.link(cell / "optim.bin", kept / "optim.bin")
    before = {name: os.stat(cell / name).st_ino for name in ("model.bin", "optim.bin")}
    assert own_files(cell, lambda info, discarded: False, lambda: links_inside(trash)) == []
    assert os.stat(cell / "model.bin").st_ino == before["model.bin"]  # no copy: only the trash shares it
    assert os.stat(cell / "optim.bin").st_ino != before["optim.bin"]  # a kept folder shares it: made its own
    assert (kept / "optim.bin").read_bytes() == b"o" * 100 and os.stat(kept / "optim.bin").st_nlink == 2
