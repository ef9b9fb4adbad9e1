"""Services a target's runs share (``resume_target(..., services=[...])``): started once, on the first run of a
target that names them, in the process that runs the cells; their environment reaches every run (a command
target's program too); stopped when the session ends, after Ctrl-C too; one that fails to start fails its
targets' cells with one line and is not retried, while other targets run.

The trainer is the stdlib training script (no torch), so these run in the bare environment as well.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_resume_check.builtin import train_script
from pytest_resume_check.engine import Engine
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.run import RunContext
from pytest_resume_check.targets import TargetError, resume_target

ENV_NAME = "RESUME_CHECK_TEST_SERVICE"
STARTS: list[str] = []
STOPS: list[str] = []


@contextmanager
def counting_service():
    token = uuid.uuid4().hex
    STARTS.append(token)
    try:
        yield {ENV_NAME: token}
    finally:
        STOPS.append(token)


def broken_service():
    STARTS.append("broken")
    raise ConnectionRefusedError("port 1 refused")


@contextmanager
def bad_value_service():
    yield {"PORT": 6379}


def train(run: RunContext) -> None:
    """The stdlib script, which first notes the service's variable in its checkpoint folder."""
    (run.checkpoint_dir / "service.txt").write_text(os.environ.get(ENV_NAME, "<unset>"))
    train_script.main(["--out", str(run.checkpoint_dir), "--epochs", "1"], run)


def train_again(run: RunContext) -> None:
    """The same trainer under a second target name."""
    train(run)


served = resume_target(train, name="served", steps=6, services=[counting_service])
served_too = resume_target(train_again, name="served_too", steps=6, services=[counting_service])
broken = resume_target(train, name="broken", steps=6, services=[broken_service])
bad_value = resume_target(train, name="bad_value", steps=6, services=[bad_value_service])
command_served = resume_target.command(
    ["{python}", "-c", f"import os, pathlib, sys; pathlib.Path(sys.argv[1], 'service.txt').write_text("
     f"os.environ['{ENV_NAME}']); from pytest_resume_check.builtin import train_script; "
     "train_script.main(['--out', sys.argv[1], '--epochs', '1'])", "{checkpoint_dir}"],
    name="command_served", steps=6, services=[counting_service])


@pytest.fixture
def engine(tmp_path):
    STARTS.clear()
    STOPS.clear()
    engine = Engine(tmp_path / "root", seed=0, hang_timeout=60)
    yield engine
    engine.close()


def run_once(engine, target, tmp_path, index=0):
    plan = engine.plan(target, target.cases[0], tmp_path / f"w{index}", index)
    record = engine.run(plan, target)
    assert record.outcome == Outcome.DONE, record.error
    return (Path(plan.checkpoint_dir) / "service.txt").read_text()


def test_one_service_start_serves_every_run_of_every_target_naming_it_and_close_stops_it(engine, tmp_path):
    seen = [run_once(engine, served, tmp_path, 0), run_once(engine, served, tmp_path, 1),
            run_once(engine, served_too, tmp_path, 2), run_once(engine, command_served, tmp_path, 3)]
    assert len(STARTS) == 1 and seen == STARTS * 4  # the program of a command target sees it too
    assert STOPS == [] and engine.runner.services.running == 1
    assert engine.close() == []
    assert STOPS == STARTS


def test_a_service_that_fails_to_start_is_reported_once_per_cell_and_not_retried(engine, tmp_path):
    for index in range(2):
        with pytest.raises(TargetError) as err:
            engine.plan(broken, {}, tmp_path / f"w{index}", index)
        assert re.fullmatch(
            r"target 'broken': its service test_services\.broken_service failed to start: ConnectionRefusedError: "
            r"port 1 refused \(at \S*test_services\.py:\d+\)\. The target's cells cannot run without it; fix the "
            r"service \(or its environment\) and rerun", str(err.value)), str(err.value)
    assert STARTS == ["broken"]
    assert run_once(engine, served, tmp_path, 5) == STARTS[1]  # other targets still run


def test_a_service_must_yield_string_environment_variables(engine, tmp_path):
    with pytest.raises(TargetError, match="gave {'PORT': 6379} where it must give a mapping of environment"):
        engine.plan(bad_value, {}, tmp_path / "w", 0)


def test_services_must_be_functions():
    with pytest.raises(TargetError, match="services='redis' must be a list of functions"):
        resume_target(train, name="x", steps=6, services="redis")


SLEEPER_CONFTEST = '''
    import subprocess
    from contextlib import contextmanager

    from pytest_resume_check.builtin import train_script
    from pytest_resume_check.targets import resume_target


    @contextmanager
    def sleeper():
        """A server in a session of its own, as a Ray head is: Ctrl-C at the terminal never reaches it."""
        server = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:
            yield {"SLEEPER_PID": str(server.pid)}
        finally:
            server.kill()
            server.wait()


    def train(run):
        import time
        time.sleep(float(run.case.get("sleep", 0)))
        train_script.main(["--out", str(run.checkpoint_dir), "--epochs", "1", "--save-every", "1"], run)


    slow = resume_target(train, name="slow", steps=6, cases=[{"id": "slow", "sleep": 1.0}], services=[sleeper])
'''


def marked(canary: str) -> list[int]:
    needle = f"SERVICE_CANARY={canary}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{name}/environ").read_bytes():
                if Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] != b"Z":
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_a_service_that_lives_in_a_session_of_its_own(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(SLEEPER_CONFTEST))
    canary = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--resume-matrix",
                             "-m", "resume_matrix"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "SERVICE_CANARY": canary},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    sleeping = []
    while not sleeping and proc.poll() is None and time.monotonic() < deadline:
        sleeping = [pid for pid in marked(canary) if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")]
        time.sleep(0.05)
    assert sleeping, "the service never started"
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: pytest's group, not the service's session
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-3000:]
    deadline = time.monotonic() + 10
    while marked(canary) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked(canary) == [], out[-3000:]


def _alive_pid(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


STARTED: list[int] = []


@contextmanager
def hanging_service():
    """Starts a server in a session of its own, then never becomes ready."""
    STARTED.append(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
    time.sleep(600)
    yield {}


hanging_service.start_timeout = 1  # its own limit, instead of the target's hang limit


@contextmanager
def leaky_service():
    """Starts a server in a session of its own and forgets to stop it."""
    STARTED.append(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
    yield {}


@contextmanager
def failing_stop_service():
    yield {}
    raise RuntimeError("the database would not shut down")


@contextmanager
def daemonizing_service():
    """Starts a server that detaches (setsid, its parent gone) and forgets to stop it."""
    subprocess.run(["sh", "-c", "setsid sleep 601 >/dev/null 2>&1 < /dev/null &"], check=True)
    yield {}


THREADS: list[int] = []


@contextmanager
def thread_bound_service():
    """A resource bound to the thread that made it (a sqlite connection, an event loop)."""
    import threading

    THREADS.append(threading.get_ident())
    yield {}
    THREADS.append(threading.get_ident())


hanging = resume_target(train, name="hanging", steps=6, services=[hanging_service])
daemonizing = resume_target(train, name="daemonizing", steps=6, services=[daemonizing_service])
thread_bound = resume_target(train, name="thread_bound", steps=6, services=[thread_bound_service])
leaky = resume_target(train, name="leaky", steps=6, services=[leaky_service])
failing_stop = resume_target(train, name="failing_stop", steps=6, services=[failing_stop_service])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_service_that_hangs_while_starting_fails_its_cells_within_its_limit_and_others_run(engine, tmp_path):
    STARTED.clear()
    with pytest.raises(TargetError) as info:
        engine.plan(hanging, hanging.cases[0], tmp_path / "w", 0)
    assert "its service test_services.hanging_service failed to start: it did not start within 1 s" in str(info.value)
    assert "the 1 process it had started were killed" in str(info.value)
    assert STARTED and not _alive_pid(STARTED[0])
    assert run_once(engine, served, tmp_path)  # another target's service starts and its runs go on
    with pytest.raises(TargetError, match="did not start within 1 s"):  # not tried again
        engine.plan(hanging, hanging.cases[0], tmp_path / "w", 0)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_what_a_service_leaves_running_is_ended_and_named(engine, tmp_path):
    STARTED.clear()
    run_once(engine, leaky, tmp_path)
    assert _alive_pid(STARTED[0])
    problems = engine.close()
    assert len(problems) == 1 and problems[0].startswith(
        "resume-check: service test_services.leaky_service left 1 process running after it stopped")
    assert "sleep 600" in problems[0]
    assert not _alive_pid(STARTED[0])


def test_a_stop_that_raises_names_its_service(engine, tmp_path):
    run_once(engine, failing_stop, tmp_path)
    problems = engine.close()
    assert len(problems) == 1 and problems[0].startswith(
        "resume-check: service test_services.failing_stop_service raised while stopping: RuntimeError: the database "
        "would not shut down (at ")


FAILING_STOP_CONFTEST = '''
    from contextlib import contextmanager

    from pytest_resume_check.builtin import train_script
    from pytest_resume_check.targets import resume_target


    @contextmanager
    def stubborn():
        yield {}
        raise RuntimeError("would not stop")


    def train(run):
        train_script.main(["--out", str(run.checkpoint_dir), "--epochs", "1"], run)


    stopping = resume_target(train, name="stopping", steps=6, services=[stubborn])
'''


def test_a_failing_stop_is_printed_with_its_name_under_q_and_from_xdist_workers(pytester):
    pytest.importorskip("xdist")
    pytester.makeconftest(textwrap.dedent(FAILING_STOP_CONFTEST))
    for args in (["-q"], ["-q", "-n", "2"]):
        result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-k", "ckpt1", *args)
        result.stdout.fnmatch_lines(["*resume-check: service conftest.stubborn raised while stopping: RuntimeError: "
                                     "would not stop*"])


def _sleepers(canary: str) -> list[int]:
    """The live ``sleep`` processes carrying ``canary`` (another session's sleepers, a concurrent run of this
    suite's, are not this test's)."""
    return [pid for pid in marked(canary) if _alive_pid(pid)
            and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"601"]]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_daemon_a_service_detached_is_found_by_its_environment_and_ended(engine, tmp_path, monkeypatch):
    canary = uuid.uuid4().hex
    monkeypatch.setenv("SERVICE_CANARY", canary)  # the service's daemon inherits it
    run_once(engine, daemonizing, tmp_path)
    assert _sleepers(canary)
    problems = engine.close()
    assert len(problems) == 1 and "service test_services.daemonizing_service left 1 process running" in problems[0]
    assert _sleepers(canary) == []


def test_a_service_starts_and_stops_on_one_thread(engine, tmp_path):
    THREADS.clear()
    run_once(engine, thread_bound, tmp_path)
    assert engine.close() == []
    assert len(THREADS) == 2 and THREADS[0] == THREADS[1]
