"""The fork server's life cycle as one object: started at the first run that needs it, its pid while it runs,
stopped at the end; each engine has its own, and two in one process keep their own preload and failures
(CPython has one fork server per process: one started for less than another asks is started again)."""

from __future__ import annotations

import os
import textwrap

import pytest

from pytest_resume_check.engine import Engine
from pytest_resume_check.process.fork_server import ERR_PRELOAD, ForkServer
from pytest_resume_check.targets import ISOLATION_FORKSERVER, TargetError


@pytest.fixture
def servers():
    made: list[ForkServer] = []

    def make() -> ForkServer:
        made.append(ForkServer())
        return made[-1]

    yield make
    for server in made:
        server.stop()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_fork_server_starts_when_asked_reports_its_pid_and_is_gone_once_stopped(servers):
    server = servers()
    assert server.pid is None and not server.alive()
    pid = server.ensure()
    assert pid is not None and server.pid == pid and server.alive()
    assert server.ended() is None
    assert server.ensure() == pid  # running with all it asks: not started again
    server.stop()
    assert server.pid is None and not server.alive()
    assert gone(pid)


def test_a_later_preload_starts_the_server_again_with_it(servers):
    server = servers()
    first = server.ensure()
    server.add_preload(["json"])
    assert server.ensure() not in (None, first)
    assert gone(first)


def test_a_second_fork_server_of_the_process_uses_the_running_one_when_it_does_all_it_asks(servers):
    a, b = servers(), servers()
    a.add_preload(["json", "csv"])
    pid = a.ensure()
    b.add_preload(["json"])
    assert b.ensure() == pid
    assert a.pid == b.pid == pid


def test_two_fork_servers_keep_their_own_preload(servers):
    a, b = servers(), servers()
    a.add_preload(["json"])
    first = a.ensure()
    b.add_preload(["csv"])  # a's server never imported it: b starts its own, which a's wishes are not in
    second = b.ensure()
    assert second not in (None, first) and a.pid is None
    third = a.ensure()  # b's server lacks json: a starts its own again
    assert third not in (None, first, second) and b.pid is None


def test_a_preload_module_that_fails_is_refused_only_for_the_server_that_names_it(servers, tmp_path, monkeypatch):
    (tmp_path / "rc_fs_broken.py").write_text(textwrap.dedent("""\
        raise ImportError("broken on purpose")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # the server imports with this process's sys.path
    a, b = servers(), servers()
    with pytest.raises(TargetError) as refused:
        a.check_preload("t", ["rc_fs_broken"], ISOLATION_FORKSERVER)
    assert str(refused.value).startswith(ERR_PRELOAD.split("{error}")[0].format(target="t", module="rc_fs_broken"))
    b.check_preload("u", ["json"], ISOLATION_FORKSERVER)  # b does not name it: nothing to refuse


def test_a_module_that_kills_the_server_is_refused_also_by_a_second_object_using_the_restarted_server(
        servers, tmp_path, monkeypatch):
    (tmp_path / "rc_fs_killer.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = servers(), servers()
    with pytest.raises(TargetError, match="importing it ended the interpreter with exit code 3"):
        a.check_preload("t", ["rc_fs_killer"], ISOLATION_FORKSERVER)
    with pytest.raises(TargetError, match="importing it ended the interpreter with exit code 3"):
        b.check_preload("u", ["rc_fs_killer"], ISOLATION_FORKSERVER)
    assert a.pid == b.pid is not None  # b found a's server (started without the module) doing all it asks


def test_an_engine_owns_one_fork_server_its_runs_start_from_and_stops_it(tmp_path):
    engine = Engine(tmp_path / "session", seed=0)
    other = Engine(tmp_path / "other", seed=0)
    assert engine.runner.fork_server is engine.fork_server
    assert other.fork_server is not engine.fork_server
    try:
        pid = engine.fork_server.ensure()
        assert engine.fork_server.pid == pid
    finally:
        engine.stop_server()
    assert engine.fork_server.pid is None and gone(pid)


#: A process forked from this one after its fork server started holds the server's liveness pipe (a loader's
#: worker left running, a test's child); a second server object that must start the server again then asks
#: for another preload. Run in an interpreter of its own, so a restart that waits on the server cannot hang
#: the suite: it prints the two pids when the restart returns.
HOLDER = """
import os
from pytest_resume_check.process.fork_server import ForkServer


def main():
    first = ForkServer()
    first.add_preload(["json"])
    old = first.ensure()
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # keeps every descriptor it inherited, the server's liveness pipe among them
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    second = ForkServer()
    second.add_preload(["csv"])
    new = second.ensure()
    print(old, new, flush=True)
    os.close(write)
    os.waitpid(holder, 0)
    second.stop()


if __name__ == "__main__":  # the fork server imports this file again as its main module
    main()
"""


def test_starting_the_server_again_does_not_wait_on_one_a_forked_process_keeps_alive(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    # The limit only keeps a hang from stopping the suite: the restart takes well under a second.
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    old, new = map(int, done.stdout.split())
    assert new != old and gone(old)
