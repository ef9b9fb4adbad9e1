"""The harness opens only regular files it has checked: a shared first run's snapshot, a command target's
``outputs=`` digest and the GitHub step summary meet a FIFO (which waits for a writer, or a reader, forever), a
device (``/dev/zero`` never ends) or a symbolic link out of the run's folder, and neither wait on it nor read
through it. A FIFO's other end is held by the test where the harness used to open it, so each test ends
either way: what the harness did shows in what the FIFO carried."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_resume_check.cells.snapshots import Unshareable, take_snapshot
from pytest_resume_check.child.command import MISSING, MSG_OUTPUT_REFUSED, REFUSED, output_digests
from pytest_resume_check.child.watch import Watcher
from pytest_resume_check.plugin.summary import ERR_STEP_SUMMARY_NOT_REGULAR, _write_step_summary
from pytest_resume_check.records import regular_files as rf
from pytest_resume_check.records.commits import MAX_POINTER_BYTES
from pytest_resume_check.records.faults import EXTRA_TORN, EXTRA_UNSYNCED, NOT_CUT, apply_after_kill


class FifoWriter:
    """Writes ``data`` into the FIFO at ``path`` and closes it, from a thread: its open waits for a reader.
    :meth:`finish` gives it a reader of its own, so it ends whether or not the code under test read."""

    def __init__(self, path: Path, data: bytes = b"bytes a reader of the FIFO gets"):
        self.path, self.data = path, data
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.write(fd, self.data)
        finally:
            os.close(fd)

    def finish(self) -> bytes:
        """What the writer left unread in the FIFO, once it has ended."""
        reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.thread.join()
            return os.read(reader, 1 << 16)
        finally:
            os.close(reader)


def _live(tmp_path: Path) -> Path:
    live = tmp_path / "live"
    (live / "step_1").mkdir(parents=True)
    (live / "step_1" / "weights.bin").write_bytes(b"w" * 1000)
    return live


def test_a_fifo_in_the_checkpoint_folder_is_made_anew_in_the_snapshot_never_opened(tmp_path):
    live = _live(tmp_path)
    os.mkfifo(live / "progress.fifo", 0o640)
    writer = FifoWriter(live / "progress.fifo")
    take_snapshot(live, tmp_path / "snap", {})
    assert writer.finish() == writer.data  # nobody read it
    copy = os.lstat(tmp_path / "snap" / "progress.fifo")
    assert stat.S_ISFIFO(copy.st_mode) and stat.S_IMODE(copy.st_mode) == 0o640
    assert (tmp_path / "snap" / "step_1" / "weights.bin").read_bytes() == b"w" * 1000


def test_a_socket_in_the_checkpoint_folder_makes_the_snapshot_unshareable_naming_it(tmp_path, monkeypatch):
    live = _live(tmp_path)
    monkeypatch.chdir(live / "step_1")  # a short relative name: a socket's path has a small limit
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("control.sock")
        with pytest.raises(Unshareable) as refused:
            take_snapshot(live, tmp_path / "snap", {})
    assert (refused.value.rel, refused.value.kind) == ("step_1/control.sock", rf.KIND_SOCKET)


def test_links_in_the_checkpoint_folder_are_copied_as_links_and_never_read_through(tmp_path):
    live = _live(tmp_path)
    (live / "zeros").symlink_to("/dev/zero")
    (live / "latest").symlink_to("step_1")
    take_snapshot(live, tmp_path / "snap", {})
    assert os.readlink(tmp_path / "snap" / "zeros") == "/dev/zero"
    assert os.readlink(tmp_path / "snap" / "latest") == "step_1"


def _run_folder(tmp_path: Path) -> tuple[Path, Path]:
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    (run / "final").mkdir(parents=True)
    (run / "final" / "model.pt").write_bytes(b"model")
    outside.mkdir()
    (outside / "secret.txt").write_text("not the run's")
    return run, outside


def test_an_output_linking_out_of_the_run_folder_is_refused_and_not_read(tmp_path):
    run, outside = _run_folder(tmp_path)
    (run / "model.pt").symlink_to(outside / "secret.txt")
    (run / "export").symlink_to(outside)
    found = output_digests(run, ["model.pt", "export"])
    link_out = rf.KIND_LINK_OUT.format(target=outside / "secret.txt", folder=run)
    assert found.refused == {"model.pt": link_out,
                             "export": rf.KIND_LINK_OUT.format(target=outside, folder=run)}
    assert found.digests == {"model.pt": REFUSED, "export": REFUSED}
    (run / "zeros.pt").symlink_to("/dev/zero")  # read, it would never end
    (run / "up.pt").symlink_to("../elsewhere/secret.txt")
    found = output_digests(run, ["zeros.pt", "up.pt"])
    assert found.refused["zeros.pt"] == rf.KIND_LINK_OUT.format(target="/dev/zero", folder=run)
    assert found.refused["up.pt"] == rf.KIND_LINK_OUT.format(target="up.pt", folder=run)


def test_a_fifo_output_is_refused_without_waiting_for_a_writer(tmp_path):
    run, _ = _run_folder(tmp_path)
    os.mkfifo(run / "model.pt")
    writer = FifoWriter(run / "model.pt")
    found = output_digests(run, ["model.pt", "final"])
    assert writer.finish() == writer.data
    assert found.refused == {"model.pt": rf.KIND_FIFO}
    assert set(found.digests) == {"model.pt", "final/model.pt"}
    headline = MSG_OUTPUT_REFUSED.format(name="model.pt", kind=rf.KIND_FIFO)
    assert headline.startswith("delivered model.pt, which is a FIFO: ")
    assert headline.endswith("deliver model.pt as a regular file")


def test_the_command_recipe_quotes_the_refusal_as_the_harness_says_it():
    page = (Path(__file__).resolve().parents[2] / "docs" / "recipes" / "command.md").read_text()
    said = "PROTOCOL: the reference run " + MSG_OUTPUT_REFUSED.format(name="model.json", kind=rf.KIND_FIFO)
    assert f"```text\n{said}\n```" in page


def test_links_that_stay_in_the_run_folder_are_followed_relative_or_absolute(tmp_path):
    run, _ = _run_folder(tmp_path)
    (run / "model.pt").symlink_to("final/model.pt")
    (run / "absolute.pt").symlink_to(run / "final" / "model.pt")
    (run / "final" / "again").symlink_to("..")  # a folder reached again ends there
    (run / "latest").symlink_to("final")
    found = output_digests(run, ["model.pt", "absolute.pt", "latest"])
    assert not found.refused
    model = hashlib.sha256(b"model").hexdigest()
    assert found.digests["model.pt"] == found.digests["absolute.pt"] == found.digests["latest/model.pt"] == model
    (run / "gone.pt").symlink_to("final/nothing.pt")
    found = output_digests(run, ["gone.*", "nothing_matches.pt"])
    assert found.refused == {"gone.pt": rf.KIND_LINK_NOWHERE.format(target="final/nothing.pt")}
    assert found.digests["nothing_matches.pt"] == MISSING


def test_a_file_is_read_up_to_the_size_it_had_when_checked(tmp_path):
    path = tmp_path / "growing.bin"
    path.write_bytes(b"a" * 10)
    fd = rf.open_regular(str(path))
    try:
        with open(path, "ab") as more:
            more.write(b"b" * 10)
            more.flush()
            chunks = rf.read_chunks(fd)
            first = next(chunks)
        assert first == b"a" * 10 + b"b" * 10  # the size is taken as reading starts
        with open(path, "ab") as more:
            more.write(b"c" * 10)
        assert list(chunks) == []  # and not a byte more is read
    finally:
        os.close(fd)


class Terminal:
    """The terminal reporter's line writer, as the step summary uses it."""

    def __init__(self):
        self.lines: list[str] = []

    def write_line(self, line: str, **_: object) -> None:
        self.lines.append(line)


def test_a_fifo_as_the_step_summary_is_refused_with_one_warning_naming_it(tmp_path):
    fifo = tmp_path / "step-summary"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader present: a plain open would not wait
    try:
        with pytest.warns(pytest.PytestWarning) as said:
            _write_step_summary(Terminal(), [], "resume matrix: 0 cells", str(fifo))
        assert os.read(reader, 1 << 16) == b""  # nothing was written into it
    finally:
        os.close(reader)
    message = ERR_STEP_SUMMARY_NOT_REGULAR.format(path=fifo, kind=rf.KIND_FIFO)
    assert [str(w.message) for w in said] == [message]
    assert "--resume-matrix-step-summary or $GITHUB_STEP_SUMMARY at a regular file" in message
    with pytest.warns(pytest.PytestWarning) as said:  # with nobody reading, it does not wait for one
        _write_step_summary(Terminal(), [], "resume matrix: 0 cells", str(fifo))
    assert [str(w.message) for w in said] == [message]
    with pytest.warns(pytest.PytestWarning) as said:
        _write_step_summary(Terminal(), [], "resume matrix: 0 cells", "/dev/zero")
    assert [str(w.message) for w in said] == [
        ERR_STEP_SUMMARY_NOT_REGULAR.format(path="/dev/zero", kind=rf.KIND_CHAR_DEVICE)]


def test_dev_null_as_the_step_summary_takes_none_without_a_warning(recwarn):
    _write_step_summary(Terminal(), [], "resume matrix: 0 cells", os.devnull)  # as docs/github.md says
    assert not [w for w in recwarn if issubclass(w.category, pytest.PytestWarning)]


def test_a_regular_step_summary_behind_a_link_is_appended_to(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("before\n")
    (tmp_path / "link.md").symlink_to(summary)
    _write_step_summary(Terminal(), [], "resume matrix: 0 cells", str(tmp_path / "link.md"))
    assert summary.read_text().startswith("before\n\n### resume matrix: 0 cells")


def test_open_inside_never_leaves_the_folder_by_dot_dot(tmp_path):
    run, _ = _run_folder(tmp_path)
    with pytest.raises(rf.NotRegular):
        rf.open_inside(str(run), "../elsewhere/secret.txt")
    fd = rf.open_inside(str(run), "final/../final/model.pt")
    try:
        assert b"".join(rf.read_chunks(fd)) == b"model"
    finally:
        os.close(fd)


# -- the zero-change watcher's pointer files, and the damage a power loss leaves --------------------

def _pointer_text(root: Path, rel: str) -> str | None:
    """What the watcher reads from the pointer file ``rel`` of a run whose folder is ``root`` (the method
    needs only the folder of the watcher it belongs to)."""
    return Watcher._pointer_text(SimpleNamespace(root=str(root)), rel)  # type: ignore[arg-type]


def test_the_watcher_reads_a_pointer_file_that_is_regular_and_refuses_a_fifo_without_waiting(tmp_path):
    (tmp_path / "latest.txt").write_text("step_2")
    assert _pointer_text(tmp_path, "latest.txt") == "step_2"
    os.mkfifo(tmp_path / "latest")
    writer = FifoWriter(tmp_path / "latest", b"step_3")
    assert _pointer_text(tmp_path, "latest") is None  # names nothing: the program's thread is never held
    assert writer.finish() == b"step_3"


def test_the_watcher_reads_at_most_a_pointers_worth_of_a_big_file_and_nothing_through_a_link_out(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("step_9")
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest").symlink_to(outside)
    assert _pointer_text(run, "latest") is None
    (run / "big").write_bytes(b"s" * (10 * MAX_POINTER_BYTES))
    assert _pointer_text(run, "big") is None  # too long to be a pointer, and read only that far


def test_the_damage_after_a_kill_cuts_only_regular_files_inside_the_folder_and_names_the_others(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * 100)
    run = tmp_path / "run"
    (run / "step_2").mkdir(parents=True)
    (run / "step_2" / "model.bin").write_bytes(b"m" * 100)
    (run / "step_2" / "optim.bin").symlink_to(outside)
    os.mkfifo(run / "step_2" / "data.bin")
    writer = FifoWriter(run / "step_2" / "data.bin")
    damage = apply_after_kill(str(run), {
        EXTRA_UNSYNCED: {"step_2/model.bin": 10, "step_2/optim.bin": 0, "step_2/data.bin": 0, "../outside.bin": 0,
                         "step_2/gone.bin": 0},
        EXTRA_TORN: "step_2",
    })
    assert writer.finish() == writer.data  # never opened
    assert (run / "step_2" / "model.bin").read_bytes() == b"m" * 10
    assert outside.read_bytes() == b"o" * 100  # neither through the link nor by "..": it is not the run's
    assert damage.not_durable == (("step_2/model.bin", 10),) and damage.torn is None
    refused = [("../outside.bin", rf.KIND_LINK_OUT.format(target="../outside.bin", folder=run)),
               ("step_2/data.bin", rf.KIND_FIFO),
               ("step_2/optim.bin", rf.KIND_LINK_OUT.format(target=outside, folder=run)),
               ("step_2", rf.KIND_FOLDER)]  # the files to make not durable in order, then the one to tear
    assert damage.describe()[1:] == [NOT_CUT.format(refusal=f"{rel} is {kind}") for rel, kind in refused]


def test_the_damage_after_a_kill_never_cuts_a_file_another_path_shares_by_hard_link(tmp_path):
    """A cell's folder shares files with a later snapshot, or with a resume's kept evidence, by hard link:
    the damage cuts the run's name only, after giving it a copy of its own; the other link keeps its bytes."""
    run, snapshot = tmp_path / "run", tmp_path / "snapshot"
    (run / "step_2").mkdir(parents=True)
    snapshot.mkdir()
    (run / "latest").write_bytes(b"step_2")
    (run / "step_2" / "model.bin").write_bytes(b"m" * 100)
    os.chmod(run / "latest", 0o640)
    os.link(run / "latest", snapshot / "latest")
    os.link(run / "step_2" / "model.bin", snapshot / "model.bin")
    damage = apply_after_kill(str(run), {EXTRA_UNSYNCED: {"latest": 0}, EXTRA_TORN: "step_2/model.bin"})
    assert damage.not_durable == (("latest", 0),) and damage.torn == ("step_2/model.bin", 100, 50)
    assert (run / "latest").read_bytes() == b"" and (run / "step_2" / "model.bin").read_bytes() == b"m" * 50
    assert (snapshot / "latest").read_bytes() == b"step_2" and (snapshot / "model.bin").read_bytes() == b"m" * 100
    assert os.stat(run / "latest").st_mode & 0o777 == 0o640
    assert os.stat(snapshot / "latest").st_nlink == 1 and os.stat(run / "latest").st_nlink == 1
    assert sorted(p.name for p in run.iterdir()) == ["latest", "step_2"]  # no copy left beside it
