"""The sweep after a run: what escaped the run's process group is found and killed. Under the fork server
it reads only the server's own tree (a subreaper adopts what a run detaches), not every process of
``/proc``; where that tree cannot be read, the full search by the run's token is kept.

A stand-in fork server (a Python process that made itself a child subreaper, as the real one does) starts
a "run" that detaches a daemon (``setsid`` and a double fork) and a detached process with a child of its
own, then exits, as a killed run leaves them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pytest_resume_check.process import sweep

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

SERVER = r'''
import ctypes, os, signal, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as the fork server
read, write = os.pipe()
run = os.fork()
if run == 0:
    middle = os.fork()
    if middle == 0:  # a daemon: setsid and a double fork
        os.setsid()
        if os.fork() == 0:
            os.write(write, b"%d\n" % os.getpid())
            time.sleep(600)
        os._exit(0)
    os.waitpid(middle, 0)
    if os.fork() == 0:  # a detached helper that forked a worker of its own
        os.setsid()
        if os.fork() == 0:
            os.write(write, b"%d\n" % os.getpid())
            time.sleep(600)
        os.write(write, b"%d\n" % os.getpid())
        time.sleep(600)
    os._exit(0)  # the run ends (a kill would do the same): what it detached is adopted by this server
os.close(write)
lines = os.fdopen(read)
pids = [lines.readline().strip() for _ in range(3)]
os.waitpid(run, 0)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # what it adopts is reaped when it dies
print(" ".join(pids), flush=True)
time.sleep(600)
'''


@pytest.fixture
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    escaped = {int(p) for p in proc.stdout.readline().split()}
    yield proc, escaped
    for pid in escaped:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


def test_what_a_forked_run_detached_is_found_below_the_server_without_reading_other_processes(server, monkeypatch):
    proc, escaped = server
    opened: list[str] = []

    def spy(path, *args, **kwargs):
        opened.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(sweep, "open", spy, raising=False)
    found = set(sweep.escaped("no-such-token", proc.pid))
    assert found == escaped
    read = {int(path.split("/")[2]) for path in opened if path.startswith("/proc/") and path.split("/")[2].isdigit()}
    assert read <= {proc.pid, *escaped}, "the sweep read processes that are not the server's"


def test_the_sweep_kills_an_escaped_daemon_and_a_detached_helper_with_its_worker(server):
    proc, escaped = server
    assert sweep.sweep("no-such-token", proc.pid) == len(escaped)
    assert sweep.escaped("no-such-token", proc.pid) == []
    assert not any(map(_lives, escaped))


def _lives(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_without_a_server_tree_to_read_a_process_exec_d_with_the_run_s_token_is_found_by_the_full_search():
    token = uuid.uuid4().hex
    # A server that died: its pid names no process, so its tree cannot be read. Above the kernel's pid_max, so
    # no process can take it meanwhile (a reaped child's pid could: the kernel reuses pids, and a busy machine
    # wraps its 32768 in minutes).
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    marked = subprocess.Popen(["sleep", "600"], env={**os.environ, sweep.RUN_TOKEN_ENV: token})
    try:
        assert sweep.descendants(gone) is None
        assert sweep.escaped(token, gone) == [marked.pid]
        assert sweep.escaped(token) == [marked.pid]  # a spawned run: no server at all
    finally:
        marked.kill()
        marked.wait()
