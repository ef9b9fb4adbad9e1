"""The folder shared fork servers live in is the user's own: made 0700, and refused (no sharing) when it is a
symlink or open to others; a slot's name changes with what its server would import."""

from __future__ import annotations

import hashlib
import os
import tempfile

from pytest_resume_check.process import shared_server


def test_the_folder_is_made_private(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = shared_server.private_root()
    assert root is not None and root.parent == tmp_path
    assert os.stat(root).st_mode & 0o777 == 0o700


def test_a_folder_open_to_others_or_a_symlink_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / shared_server.ROOT_NAME.format(uid=os.getuid())
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    assert shared_server.private_root() is None
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)
    assert shared_server.private_root() is None


def test_a_slot_is_named_by_what_its_server_imports():
    work = {"import": ["a"], "call": [], "path": ["/p"], "auto": [], "warm_torch": False, "torch_seed": 1}
    assert shared_server.slot_name(work) == shared_server.slot_name({**work, "torch_seed": 2})
    assert shared_server.slot_name(work) != shared_server.slot_name({**work, "import": ["a", "b"]})
    assert shared_server.slot_name(work) != shared_server.slot_name({**work, "path": ["/q"]})


def test_a_server_is_stale_when_a_file_it_imported_or_a_variable_its_imports_read_changed(tmp_path, monkeypatch):
    module = tmp_path / "mod.py"
    module.write_text("x = 1\n")
    # As the server records a project file (by its contents) and a variable its imports read.
    found = {"files": {str(module): hashlib.sha256(module.read_bytes()).hexdigest()}, "env": {"SOME_SETTING": "1"}}
    monkeypatch.setenv("SOME_SETTING", "1")
    assert shared_server.stale(found) is None
    monkeypatch.setenv("SOME_SETTING", "2")
    assert shared_server.stale(found) == shared_server.WHY_ENV.format(name="SOME_SETTING")
    monkeypatch.setenv("SOME_SETTING", "1")
    module.write_text("x = 2\n")
    assert shared_server.stale(found) == shared_server.WHY_FILE.format(file=module)


def test_the_shells_own_variables_leave_a_server_warm(monkeypatch):
    """A library that copied the whole environment while the server imported it read every name, the shell's
    bookkeeping too: the same rerun line typed after a ``cd`` elsewhere and back, or as ``python -m pytest``
    instead of ``pytest``, must not find the server stale."""
    found = {"files": {}, "env": {"OLDPWD": "/a", "_": "/usr/bin/pytest", "SHLVL": "1", "PWD": "/p",
                                  "SOME_SETTING": "1"}}
    monkeypatch.setenv("SOME_SETTING", "1")
    for name, value in (("OLDPWD", "/b"), ("_", "/usr/bin/python3"), ("SHLVL", "2"), ("PWD", "/p/../p")):
        monkeypatch.setenv(name, value)
    assert shared_server.stale(found) is None
    monkeypatch.setenv("SOME_SETTING", "2")
    assert shared_server.stale(found) == shared_server.WHY_ENV.format(name="SOME_SETTING")
