"""A failing cell's kept folders from a cluster node to the session, with what trainers leave in them: links
(an absolute ``latest`` among them), FIFOs, hard links; and archives no node of ours makes (unsafe names, links
out, special entries, a small archive that unpacks into a big one, one that cannot be read). What is refused
is named on one line of the cell's report and in its JSON; the rest is kept; a ``kept:`` line never names
folders that are gone. Each goes through the node's packing and the executor's unpacking, as on a cluster."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from pytest_resume_check.cluster import wire

NODE = {"ip": "10.0.0.2", "host": "n2", "node_id": "c" * 56}
NODE_NAME = "10.0.0.2 (n2, node id cccccccccccc)"
CELL, REF = ("t", "ok", "auto-ckpt1"), ("t", "ok", "reference")


def kept_line(cell: Path) -> str:
    from pytest_resume_check.report.text import kept_line

    return kept_line(cell)


def node_record(remote: Path) -> dict:
    """A failing cell's record as the group's pytest on the node writes it."""
    cell, reference = remote.joinpath(*CELL), remote.joinpath(*REF)
    return {"name": "t[ok-auto-ckpt1]", "outcome": wire.FAILED, "root": str(remote),
            "text": f"LOST: 1 input\n{kept_line(cell)}\n  rerun: pytest x",
            "cell_json": {"runs": [{"log_file": str(cell / "run0.log")}], "rerun": "pytest x"},
            "kept": [str(cell), str(reference)], "kept_line": kept_line(cell), "reference_seconds": 0.5}


def executor(here: Path, copy_bytes: int = 10_000_000):
    from pytest_resume_check.cluster import executor as ex

    runner = ex.RayExecutor(ex.Settings("a:1", 0, copy_bytes, "--ray", "--ray-retries", "--ray-copy"), here)
    return runner, ex.Task("t ok auto", ["t[ok-auto-ckpt1]"], {}, {}, node=NODE)


def through_the_node(record: dict, copy_bytes: int = 10_000_000) -> dict:
    """``record`` as the node's task sends it: its kept folders packed."""
    from pytest_resume_check.cluster.node import Group

    group = Group({"session": "s" * 32, "copy_limit": copy_bytes})
    try:
        return group._with_evidence(dict(record))
    finally:
        group.stop()


def sessions(tmp_path: Path) -> tuple[Path, Path]:
    remote, here = tmp_path / "node" / "resume-matrix0", tmp_path / "here" / "resume-matrix0"
    for folder in (remote.joinpath(*CELL), remote.joinpath(*REF)):
        (folder / "out").mkdir(parents=True)
        (folder / "run0.log").write_text(f"the log of {folder.name}\n")
    here.mkdir(parents=True)
    return remote, here


def test_links_inside_come_back_relative_and_what_cannot_travel_is_named(tmp_path):
    from pytest_resume_check.cluster.outcomes import REFUSED_KEY

    remote, here = sessions(tmp_path)
    out = remote.joinpath(*CELL) / "out"
    (out / "step_3").mkdir()
    (out / "step_3" / "model.pt").write_bytes(b"weights")
    (out / "latest").symlink_to(out / "step_3")  # absolute, as trainers often write it
    (out / "previous").symlink_to("step_3")
    (out / "step_3" / "same").hardlink_to(out / "step_3" / "model.pt")
    (tmp_path / "secret").write_text("not the run's")
    (out / "escape").symlink_to(tmp_path / "secret")
    os.mkfifo(out / "pipe")

    runner, task = executor(here)
    record = through_the_node(node_record(remote))
    got = runner._outcome_of(dict(record), task)

    mine = here.joinpath(*CELL) / "out"
    assert os.readlink(mine / "latest") == "step_3" and (mine / "latest" / "model.pt").read_bytes() == b"weights"
    assert os.readlink(mine / "previous") == "step_3"
    assert (mine / "step_3" / "same").stat().st_ino == (mine / "step_3" / "model.pt").stat().st_ino
    assert (here.joinpath(*REF) / "run0.log").read_text() == "the log of reference\n"
    assert not (mine / "escape").is_symlink() and not (mine / "pipe").exists()
    assert f"{kept_line(here.joinpath(*CELL))}\n" in got.text
    refused = [ln for ln in got.text.splitlines() if "not copied back" in ln]
    assert refused == [f"  not copied back from node {NODE_NAME}: {mine / 'escape'} (a symbolic link to "
                       f"{tmp_path / 'secret'}, outside its kept folder; left out on the node); {mine / 'pipe'} "
                       f"(a FIFO; left out on the node)"]
    assert got.cell_json[REFUSED_KEY] == [
        {"path": str(mine / "escape"), "why": f"a symbolic link to {tmp_path / 'secret'}, outside its kept folder",
         "where": "node"},
        {"path": str(mine / "pipe"), "why": "a FIFO", "where": "node"}]
    again = runner._outcome_of(dict(record), task)  # a second cell of the group brings the same reference folder
    assert again.text == got.text and (mine / "latest" / "model.pt").read_bytes() == b"weights"


def archive(*entries: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def cell_path(*names: str) -> str:
    return "/".join((*CELL, *names))


def test_an_archive_is_unpacked_entry_by_entry_and_each_refusal_is_named(tmp_path):
    from pytest_resume_check.cluster.outcomes import REFUSED_KEY

    remote, here = sessions(tmp_path)
    data = archive(
        (entry(cell_path("out"), tarfile.DIRTYPE), None),
        (entry(cell_path("out", "a.txt")), b"kept"),
        (entry("/tmp/abs.txt"), b"x"),
        (entry(cell_path("..", "..", "up.txt")), b"x"),
        (entry("t/other/stray.txt"), b"x"),  # in no kept folder of the cell
        (entry(cell_path("out", "to-etc"), tarfile.SYMTYPE, "/etc"), None),
        (entry(cell_path("out", "up"), tarfile.SYMTYPE, "../../.."), None),
        (entry(cell_path("out", "dir-link"), tarfile.SYMTYPE, "."), None),
        (entry(cell_path("out", "dir-link", "through.txt")), b"x"),  # written through a link: never
        (entry(cell_path("out", "pipe"), tarfile.FIFOTYPE), None),
        (entry(cell_path("out", "tty"), tarfile.CHRTYPE), None),
        (entry(cell_path("out", "b.txt")), b"kept too"),
        # Each link alone leads inside; together the first leads out (d is the folder, d/.. is above it).
        (entry(cell_path("loop"), tarfile.SYMTYPE, "d/.."), None),
        (entry(cell_path("d"), tarfile.SYMTYPE, "."), None),
    )
    runner, task = executor(here)
    got = runner._outcome_of({**node_record(remote), "evidence": data}, task)

    mine = here.joinpath(*CELL)
    assert (mine / "out" / "a.txt").read_bytes() == b"kept" and (mine / "out" / "b.txt").read_bytes() == b"kept too"
    assert os.readlink(mine / "out" / "dir-link") == "." and os.readlink(mine / "d") == "."
    assert not (tmp_path / "here" / "up.txt").exists() and not (here / "t" / "other").exists()
    assert not (mine / "loop").is_symlink() and not (mine / "out" / "to-etc").is_symlink()
    refused = {(r["path"], r["why"]) for r in got.cell_json[REFUSED_KEY]}
    assert refused == {
        ("/tmp/abs.txt", "a name that is absolute or holds '..'"),
        (str(here / cell_path("..", "..", "up.txt")), "a name that is absolute or holds '..'"),
        (str(here / "t/other/stray.txt"), "outside the kept folders"),
        (str(mine / "out/to-etc"), "a symbolic link to /etc, outside its kept folder"),
        (str(mine / "out/up"), "a symbolic link to ../../.., outside its kept folder"),
        (str(mine / "out/dir-link/through.txt"), "in the way here: dir-link is no folder"),
        (str(mine / "out/pipe"), "a FIFO"),
        (str(mine / "out/tty"), "a character device"),
        (str(mine / "loop"), "a symbolic link to d/.., outside its kept folder"),
    }
    assert {r["where"] for r in got.cell_json[REFUSED_KEY]} == {"here"}
    line = next(ln for ln in got.text.splitlines() if "not copied back" in ln)
    assert line.endswith("; and 6 more (the cell's JSON names each, under evidence_refused)")
    assert f"{kept_line(mine)}\n" in got.text


def test_a_small_archive_that_unpacks_past_the_copy_limit_stops_there(tmp_path):
    from pytest_resume_check.cluster.outcomes import REFUSED_KEY

    remote, here = sessions(tmp_path)
    bomb = archive((entry(cell_path("first.bin")), b"\1" * 1000),
                   (entry(cell_path("zeros.bin")), bytes(3 << 20)),  # 3 MiB of zeros: a few KiB packed
                   (entry(cell_path("after.bin")), b"\2" * 10))
    assert len(bomb) < 20_000
    runner, task = executor(here, copy_bytes=1 << 20)
    got = runner._outcome_of({**node_record(remote), "evidence": bomb}, task)

    mine = here.joinpath(*CELL)
    assert (mine / "first.bin").read_bytes() == b"\1" * 1000
    assert sorted(p.name for p in mine.iterdir()) == ["first.bin"]  # no part of the big one, nothing after it
    assert got.cell_json[REFUSED_KEY] == [{"path": str(mine / "zeros.bin"), "where": "here",
                                           "why": "over the copy limit of 1048576 bytes: the archive was read no "
                                                  "further"}]


def test_when_nothing_could_be_unpacked_the_kept_line_says_so(tmp_path):
    from pytest_resume_check.cluster.outcomes import LOST_KEY, MSG_KEPT_NOTHING

    remote, here = sessions(tmp_path)
    runner, task = executor(here)
    record = node_record(remote)
    got = runner._outcome_of({**record, "evidence": b"\x1f\x8b not a whole archive"}, task)

    assert str(remote) not in got.text and "not copied back" not in got.text
    why = next(iter(got.cell_json[LOST_KEY]["why"].splitlines()))
    assert why.startswith("the archive could not be read on: ")
    assert got.text.splitlines()[1] == MSG_KEPT_NOTHING.format(node=NODE_NAME, why=why)
    assert got.cell_json[LOST_KEY]["paths"] == record["kept"] and got.cell_json[LOST_KEY]["node"] == NODE
    assert "kept_on_node" not in got.cell_json


def test_evidence_too_big_to_copy_stays_on_the_node_and_the_json_says_where(tmp_path):
    from pytest_resume_check.cluster.outcomes import LEFT_KEY

    remote, here = sessions(tmp_path)
    (remote.joinpath(*CELL) / "big.bin").write_bytes(bytes(2000))
    runner, task = executor(here, copy_bytes=1000)
    from pytest_resume_check.cluster.node import Group

    group = Group({"session": "s" * 32, "copy_limit": 1000})
    try:
        got = runner._outcome_of(group._with_evidence(node_record(remote)), task)
        assert group.folder.exists()
    finally:
        group.keep = False
        group.stop()
    assert got.cell_json[LEFT_KEY]["node"] == NODE and f"{kept_line(remote.joinpath(*CELL))}\n" in got.text


@pytest.mark.parametrize("grows", [False, True])
def test_packing_reads_no_more_than_the_copy_limit(tmp_path, grows):
    from pytest_resume_check.cluster.evidence import ON_NODE, WHY_GREW, Refused, pack

    remote, _ = sessions(tmp_path)
    cell = remote.joinpath(*CELL)
    (cell / "a.bin").write_bytes(bytes(600))
    (cell / "b.bin").write_bytes(bytes(600 if grows else 300))  # measured smaller, grown since
    packed = pack([cell], remote, 1000)
    with tarfile.open(fileobj=io.BytesIO(packed.data)) as tar:
        names = {m.name for m in tar.getmembers()}
    assert cell_path("a.bin") in names and (cell_path("b.bin") in names) is not grows
    assert packed.refused == ([Refused(cell_path("b.bin"), WHY_GREW.format(limit=1000), ON_NODE)] if grows else [])


def test_folders_the_node_could_not_pack_stay_there_and_the_report_says_so(tmp_path, monkeypatch):
    from pytest_resume_check.cluster import node
    from pytest_resume_check.cluster.outcomes import LEFT_KEY, MSG_NOT_PACKED

    def broken(folders, root, limit):
        raise MemoryError("no room for the archive")

    remote, here = sessions(tmp_path)
    monkeypatch.setattr(node, "pack", broken)
    runner, task = executor(here)
    group = node.Group({"session": "s" * 32, "copy_limit": 10_000})
    try:
        got = runner._outcome_of(group._with_evidence(node_record(remote)), task)
        assert group.keep and group.folder.exists()
    finally:
        group.keep = False
        group.stop()
    paths = [str(remote.joinpath(*CELL)), str(remote.joinpath(*REF))]
    assert got.text.endswith("\n" + MSG_NOT_PACKED.format(node=NODE_NAME, why="MemoryError: no room for the archive",
                                                          paths=", ".join(paths)))
    assert got.cell_json[LEFT_KEY]["paths"] == paths and got.cell_json[LEFT_KEY]["node"] == NODE


def test_the_cluster_page_quotes_the_lines_as_the_executor_writes_them(tmp_path):
    from pytest_resume_check.cluster import executor as ex
    from pytest_resume_check.cluster import outcomes
    from pytest_resume_check.cluster.evidence import ON_NODE, Refused

    page = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    root = Path("/tmp/pytest-of-me/pytest-7/resume-matrix0")
    runner = ex.RayExecutor(ex.Settings("a:1", 0, 0, "--ray", "--ray-retries", "--ray-copy"), root)
    task = ex.Task("trainer ok auto", [], {}, {}, node={"ip": "10.0.0.6", "host": "gpu-box-3",
                                                        "node_id": "430c63a39cbf" + "0" * 44})
    out = "trainer/ok/auto-ckpt3/out"
    refused = [Refused(f"{out}/escape", "a symbolic link to /data/shared, outside its kept folder", ON_NODE),
               Refused(f"{out}/metrics.fifo", "a FIFO", ON_NODE)]
    assert f"\n{runner._refused_line(refused, task)}\n" in page
    nothing = outcomes.MSG_KEPT_NOTHING.format(node=task.node_name(),
                                               why="the archive could not be read on: No space left on device")
    assert f"\n{nothing}\n" in page
