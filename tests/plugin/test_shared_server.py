"""``--resume-matrix-server=on``: one fork server per project, shared by xdist's workers and kept warm for the
next session; checked against the files and environment it was started with, private to the user, ended by
its keeper when idle (also after a SIGKILLed pytest), and none at all with ``off``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from leftovers import settle
from project_session import pytest_in, write_project

from pytest_resume_check.process import shared_server
from pytest_resume_check.records.names import OPT_SERVER, SERVER_IDLE_ENV

ON = f"{OPT_SERVER}=on"
OK_CELL = "resume-matrix::files[ok-auto-ckpt1]"
WARM = re.compile(shared_server.WARM.replace("{pid}", r"(\d+)").replace("{age:.0f}", r"\d+"))
#: Generous bound for a keeper to notice it is idle and end (its limit is 2 s where a test waits for that).
GONE_BOUND = 120.0


@pytest.fixture
def private():
    """A TMPDIR of the test's own (the user's private folder for shared servers lies in it), a short idle
    limit, and every keeper found there ended at the end."""
    # Short: multiprocessing's own socket (a session's own server) lies in it too, and a socket's path is short.
    tmp = Path(tempfile.mkdtemp(prefix="rc-test-", dir="/tmp"))
    env = {"TMPDIR": str(tmp), SERVER_IDLE_ENV: "120"}
    yield env
    root = tmp / shared_server.ROOT_NAME.format(uid=os.getuid())
    for record in servers(root):
        for pid in (record["keeper"], record["pid"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(tmp, ignore_errors=True)


def servers(root: Path) -> list[dict]:
    """The records of the shared servers running under ``root``."""
    if not root.is_dir():
        return []
    return [record for folder in root.iterdir() if (record := shared_server.Slot(folder).server()) is not None]


def root_of(env: dict[str, str]) -> Path:
    return Path(env["TMPDIR"]) / shared_server.ROOT_NAME.format(uid=os.getuid())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def wait_until(condition, bound: float = GONE_BOUND) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_second_session_forks_from_the_warm_server_the_first_started(tmp_path, private):
    project = write_project(tmp_path / "p")
    code, first = pytest_in(project, OK_CELL, ON, env=private)
    assert code == 0, first
    assert shared_server.COLD_NEW.format(pid=servers(root_of(private))[0]["pid"]) in first
    (record,) = servers(root_of(private))
    code, second = pytest_in(project, OK_CELL, ON, env=private)
    assert code == 0, second
    warm = WARM.search(second)
    assert warm is not None, second
    assert int(warm.group(1)) == record["pid"]


def test_a_changed_project_file_starts_the_server_cold(tmp_path, private):
    project = write_project(tmp_path / "p")
    assert pytest_in(project, OK_CELL, ON, env=private)[0] == 0
    (old,) = servers(root_of(private))
    trainer = project / "project_trainer.py"
    trainer.write_text(trainer.read_text() + "\n# changed\n")
    code, output = pytest_in(project, OK_CELL, ON, env=private)
    assert code == 0, output
    (new,) = servers(root_of(private))
    why = shared_server.WHY_FILE.format(file=trainer)
    assert shared_server.COLD_CHANGED.format(why=why, pid=new["pid"]) in output
    assert new["pid"] != old["pid"] and not alive(old["pid"])


def test_the_servers_folder_and_socket_are_private_to_the_user(tmp_path, private):
    project = write_project(tmp_path / "p")
    assert pytest_in(project, OK_CELL, ON, env=private)[0] == 0
    (record,) = servers(root_of(private))
    socket = Path(record["address"])
    for folder in (root_of(private), socket.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    assert stat.S_ISSOCK(os.stat(socket).st_mode)
    assert stat.S_IMODE(os.stat(socket).st_mode) == 0o600


def test_off_starts_no_shared_server(tmp_path, private):
    project = write_project(tmp_path / "p")
    code, output = pytest_in(project, OK_CELL, f"{OPT_SERVER}=off", env=private)
    assert code == 0, output
    assert "resume-check: cold" not in output and "resume-check: warm" not in output
    assert servers(root_of(private)) == []


def test_a_sigkilled_pytest_leaves_only_the_server_which_ends_at_its_idle_limit(tmp_path, private):
    gate = tmp_path / "never"  # the run waits for it: pytest is killed while the run is under the server
    project = write_project(tmp_path / "p", cases=f"[{{'id': 'held', 'gate': {str(gate)!r}}}]")
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "--resume-matrix", ON]
    private[SERVER_IDLE_ENV] = "2"
    session = subprocess.Popen(command, cwd=project, env={**os.environ, "PYTHONPATH": str(project), **private},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(servers(root_of(private))) == 1), "no shared server started"
        (record,) = servers(root_of(private))
        assert wait_until(lambda: children(record["pid"]) != []), "no run was forked from it"
    finally:
        session.kill()
        session.wait()
    held = children(record["pid"])
    assert wait_until(lambda: not alive(record["pid"]) and not alive(record["keeper"])), "the server outlived its limit"
    assert not any(alive(pid) for pid in held)


def children(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if int(fields[1]) == parent:
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_xdist_workers_fork_from_one_server_with_the_verdicts_of_their_own(tmp_path, private):
    pytest.importorskip("xdist")
    cases = "[{'id': 'ok'}, {'id': 'more'}, {'id': 'bug', 'skip': True}]"
    project = write_project(tmp_path / "p", cases=cases)
    verdicts = {}
    for mode in ("on", "off"):
        path = tmp_path / f"{mode}.json"
        code, output = pytest_in(project, "--resume-matrix", "-n", "2", f"{OPT_SERVER}={mode}", "-p",
                                 "no:cacheprovider", "--resume-matrix-seed=7", f"--resume-matrix-json={path}",
                                 env=private)
        if mode == "on":  # each worker says whether it found the server warm: both name the one server
            lines = re.findall(r"resume-check: (gw\d): (.*)", output)
            assert len(lines) == 2, output
            (record,) = servers(root_of(private))
            assert [int(re.findall(r"pid (\d+)", line)[0]) for _, line in lines] == [record["pid"]] * 2, output
        verdicts[mode] = {json.dumps([cell[key] for key in ("target", "case_id", "resume_mode", "kill")]):
                          [cell[key] for key in ("status", "categories", "headline", "rerun", "findings")]
                          for cell in json.loads(path.read_text())["cells"]}
    assert len(verdicts["on"]) > 10
    assert verdicts["on"] == verdicts["off"]


def test_daemons_runs_detach_under_a_shared_server_are_killed_and_other_runs_are_not(tmp_path, private):
    """Two workers fork from one server at once: each run's sweep kills what its run detached (a daemon in a
    session of its own, reparented to the server) and never the other worker's live run."""
    pytest.importorskip("xdist")
    canary, report = uuid.uuid4().hex, tmp_path / "verdicts.json"
    cases = "[{'id': 'daemon', 'daemon': True}, {'id': 'other', 'daemon': True}]"
    project = write_project(tmp_path / "p", cases=cases)
    code, output = pytest_in(project, "--resume-matrix", "-n", "2", ON, "-k", "ckpt2] or ckpt3]",
                             f"--resume-matrix-json={report}", env={**private, "LEFTOVER_CANARY": canary})
    assert code == 0, output
    (record,) = servers(root_of(private))
    left = settle(canary)  # only the warm server is left: its keeper, the server, the keeper's resource tracker
    assert record["pid"] in left and not children(record["pid"])
    assert all(pid in (record["keeper"], record["pid"]) or pid in children(record["keeper"]) for pid in left), left
    stories = [cell["story"] for cell in json.loads(report.read_text())["cells"]]
    assert len(stories) == 6
    assert all(re.search(r"run 2 \(resume from s\d\): ran to the end \(\d+ process(es)? it detached killed", story)
               for story in stories), stories
