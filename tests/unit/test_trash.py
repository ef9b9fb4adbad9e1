"""A passed cell's folder is deleted off the critical path: moved into the session root's trash folder at
once and deleted by a background thread, every path proven inside the root when it is moved and again
when it is deleted; a session's end waits for it and leaves no trash; a failing cell's folder is never
touched."""

from __future__ import annotations

import shutil
import threading

import pytest

from pytest_resume_check.process import layout
from pytest_resume_check.process.layout import TRASH, Layout, safe_name


def cell_folder(root, name="cell"):
    folder = root / "target" / "case" / name
    (folder / "out" / "s1").mkdir(parents=True)
    (folder / "out" / "s1" / "weights.bin").write_bytes(b"\0" * 100)
    (folder / "run0.log").write_text("log")
    return folder


def test_a_removed_folder_is_gone_at_once_and_deleted_by_another_thread(tmp_path, monkeypatch):
    deleting = []
    rmtree = shutil.rmtree

    def watched(path, *args, **kwargs):
        deleting.append(threading.current_thread() is threading.main_thread())
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(layout.shutil, "rmtree", watched)
    session = Layout(tmp_path)
    folder = cell_folder(tmp_path)
    session.remove(folder)
    assert not folder.exists() and folder.parent.is_dir()
    session.trash.empty()
    assert deleting[0] is False, "the cell's folder was deleted on the caller's thread"
    assert not (tmp_path / TRASH).exists()


def test_the_session_end_leaves_no_trash_and_keeps_a_failing_cells_folder_untouched(tmp_path):
    session = Layout(tmp_path)
    failing = cell_folder(tmp_path, "failing")
    before = {p.relative_to(failing): p.read_bytes() for p in failing.rglob("*") if p.is_file()}
    for i in range(5):
        session.remove(cell_folder(tmp_path, f"passed{i}"))
    session.fresh(cell_folder(tmp_path, "again"))  # made again: what it held is deleted too
    session.tidy()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
    assert sorted(p.name for p in (tmp_path / "target" / "case").iterdir()) == ["again", "failing"]
    assert {p.relative_to(failing): p.read_bytes() for p in failing.rglob("*") if p.is_file()} == before


def test_the_background_deleter_refuses_a_path_outside_the_root(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "canary").write_text("still here")
    session = Layout(root)
    session.trash.delete_later(elsewhere / "sub")
    session.trash.delete_later(root / ".." / "elsewhere" / "sub")
    with pytest.raises(ValueError, match=layout.ERR_OUTSIDE.split(":")[0].format(path=".*")):
        session.trash.empty()
    assert (elsewhere / "sub" / "canary").read_text() == "still here"


def test_a_trash_folder_that_leads_out_of_the_root_is_refused_and_nothing_moves(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    session = Layout(root)
    folder = cell_folder(root)
    (root / TRASH).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="refusing to delete"):
        session.remove(folder)
    assert (folder / "run0.log").read_text() == "log" and list(elsewhere.iterdir()) == []


def test_no_target_or_case_folder_can_be_named_like_the_trash():
    assert safe_name(TRASH) != TRASH
