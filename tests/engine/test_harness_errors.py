"""Every error the harness meets is a failing cell with one line that names what happened and the fix, is
in the JSON and the grid, and leaves the session running: a full disk while it snapshots a
folder, a session folder removed under it, bytes on its event channel that are no event, names too long
for the file system, a crashed pytest-xdist worker. Torch-free: these run in the bare environment too.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trust_targets as tt

from pytest_resume_check.categories import CRASHED, HARNESS, PROTOCOL
from pytest_resume_check.cells import matrix, shared_runs
from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import harness_errors, verdict
from pytest_resume_check.process import fork_server
from pytest_resume_check.process.layout import MAX_NAME_BYTES, safe_name
from pytest_resume_check.records.faults import MODE_CRASH, FaultPlan
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.targets import resume_target

plain = resume_target(steps=tt.STEPS, name="plain")(tt.plain)
server_killer = resume_target(steps=tt.STEPS, name="server_killer", cases=[{"kill_server_at": 2}])(tt.server_killer)
disk_full_saver = resume_target(steps=tt.STEPS, name="disk_full_saver", cases=[{"disk_full_at": 2}],
                                crash_save=False)(tt.disk_full_saver)
stderr_printer = resume_target(steps=tt.STEPS, name="stderr_printer", crash_save=False)(tt.stderr_printer)
scribbler = resume_target(steps=tt.STEPS, name="scribbler", cases=[{"frame": "junk"}, {"frame": "huge"}])(tt.scribbler)


@pytest.fixture
def engine(tmp_path):
    eng = Engine(tmp_path / "session", seed=2, hang_timeout=60)
    yield eng
    eng.close()


def cell(target, case, *kills, mode="auto"):
    return Cell(target, case, mode, tuple(kills), tt.STEPS)


@pytest.mark.parametrize("case, words", [({"frame": "junk"}, "5 bytes: JSONDecodeError"),
                                         ({"frame": "huge"}, "a message length of 2147483632 bytes")])
def test_bytes_on_the_event_channel_that_are_no_event_are_protocol_and_the_fork_server_survives(engine, case, words):
    result = engine.run_cell(cell(scribbler, case, KillSpec(2)))
    assert result.verdict.categories == [PROTOCOL]
    assert "wrote something to the harness's event channel that is no event" in result.verdict.headline
    assert words in result.verdict.headline
    server = engine.fork_server.pid
    after = engine.run_cell(cell(plain, {}, KillSpec(3)))  # the next target's runs start as before
    assert after.verdict.findings == [], after.verdict.headline
    assert engine.fork_server.pid == server


def test_a_fork_server_killed_under_a_run_is_harness_naming_how_and_the_next_cell_gets_a_new_server(engine):
    """The kernel's OOM killer SIGKILLs the fork server (here the run does, at the end of step 2): the run
    lost its server, it did not die by itself."""
    engine.stop_server()  # a server of this test's own, whatever earlier tests in this process started
    result = engine.run_cell(cell(server_killer, server_killer.cases[0], KillSpec(3)))
    assert result.verdict.categories == [HARNESS], result.verdict.headline
    killed = fork_server.ServerEnd(_pid_in(result.verdict.headline), signal=signal.SIGKILL)
    assert result.verdict.headline == harness_errors.server_died(killed)
    assert "killed by SIGKILL (the kernel's OOM killer sends this)" in result.verdict.headline
    after = engine.run_cell(cell(plain, {}, KillSpec(3)))  # the session goes on with a new server
    assert after.verdict.findings == [], after.verdict.headline
    assert engine.fork_server.pid not in (None, killed.pid)


def test_a_fork_server_killed_while_a_save_is_recorded_at_collection_is_no_advice_to_turn_crash_cells_off(engine):
    engine.stop_server()
    with pytest.raises(Exception) as raised:
        engine.crash_cells(server_killer, "quick")
    assert "crash_save=False" not in str(raised.value)  # its fix is not the trainer's
    assert isinstance(raised.value, fork_server.ForkServerDied)
    assert raised.value.end.signal == signal.SIGKILL
    line = harness_errors.server_died(raised.value.end)
    assert line.startswith(f"HARNESS: the fork server the runs start from (pid {raised.value.end.pid}) was killed "
                           "by SIGKILL")


def test_a_crash_cell_whose_own_save_meets_a_full_disk_is_the_trainers_crash_naming_the_disk(engine):
    """The trainer's own save fails with ENOSPC before the crash point is reached: its crash, not ``PROTOCOL:
    the last run was killed``, and the headline says the disk is full."""
    kill = KillSpec(2, fault=FaultPlan(2, MODE_CRASH, op=2, total=8))
    result = engine.run_cell(cell(disk_full_saver, disk_full_saver.cases[0], kill))
    assert result.verdict.categories == [CRASHED], result.verdict.headline
    assert "No space left on device" in result.verdict.headline
    assert result.verdict.headline.endswith(verdict.DISK_FULL)


def test_a_run_whose_log_sits_on_a_full_disk_is_harness_naming_the_log(engine, tmp_path):
    """The run's log is the harness's file: when the disk under it is full (here it is ``/dev/full``) the
    trainer's print into it raises ENOSPC, and that is the harness's failure, named with the log's path."""
    log = tmp_path / "run0.log"
    log.symlink_to("/dev/full")
    plan = dataclasses.replace(engine.plan(stderr_printer, {}, tmp_path / "w", 0, kill=KillSpec(3)),
                               log_path=str(log))
    with pytest.raises(OSError) as raised:
        engine.run(plan, stderr_printer)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(log)
    finding = harness_errors.harness_finding(raised.value, engine.root, None)
    assert finding.category == HARNESS
    assert finding.headline.startswith(harness_errors.MSG_DISK_FULL.split("{")[0])
    assert f"No space left on device: '{log}'" in finding.headline
    again = engine.run_cell(cell(stderr_printer, {}, KillSpec(3)))  # with its log on a disk with room: fine
    assert again.verdict.findings == [], again.verdict.headline


def _pid_in(headline: str) -> int:
    return int(headline.split("(pid ", 1)[1].split(")", 1)[0])


def test_a_made_up_message_length_cannot_make_the_harness_wait_past_the_hang_limit(tmp_path):
    """Four bytes claim a message of 1 MiB that never comes while the run waits at its kill point: the
    harness gives up after the hang limit (it used to wait for the bytes forever)."""
    engine = Engine(tmp_path / "session", seed=2, hang_timeout=2)
    target = scribbler.with_options(cases=[{"frame": "short"}])
    record = engine.run(engine.plan(target, target.cases[0], tmp_path / "w", 0, kill=KillSpec(2)), target)
    texts = [e.text for e in record.events if e.kind == "protocol"]
    assert texts and "a message of 1048576 bytes that did not arrive in full" in texts[0]


def test_a_full_disk_while_a_folder_is_copied_is_one_harness_line_and_the_session_goes_on(engine, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]))

    cells = [c for c in matrix.cells(plain, "quick", 2) if c.shares_prefix]
    engine.register(cells)
    monkeypatch.setattr(shared_runs, "take_snapshot", full)
    result = engine.run_cell(cells[0])
    assert result.verdict.categories == [HARNESS]
    assert result.verdict.headline.startswith(harness_errors.MSG_DISK_FULL.split("{")[0])
    assert result.verdict.headline.endswith("Free space there, or point --basetemp at a bigger disk")
    monkeypatch.undo()
    again = engine.run_cell(cells[1])  # the disk has room again: the session goes on
    assert again.verdict.findings == [], again.verdict.headline


def test_a_session_folder_removed_while_a_cell_runs_is_named(engine):
    result = engine.run_cell(cell(plain, {"remove_root": True}, KillSpec(2)))
    assert result.verdict.categories == [HARNESS]
    assert result.verdict.headline.startswith(f"HARNESS: the folder {engine.root} was removed while the cell ran")
    assert "Give each session its own --basetemp" in result.verdict.headline


def test_a_bug_of_the_harness_is_one_line_and_its_traceback_is_kept(engine, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("no such event")

    monkeypatch.setattr("pytest_resume_check.engine.judge", broken)
    result = engine.run_cell(cell(plain, {}, KillSpec(2)))
    assert result.verdict.categories == [HARNESS]
    kept = result.workdir / harness_errors.TRACEBACK_FILE
    assert result.verdict.headline == harness_errors.MSG_BUG.format(what="KeyError: 'no such event'",
                                                                    kept=f" in {kept}")
    assert "Traceback" in kept.read_text()


def test_names_are_cut_to_bytes_the_file_system_takes_and_stay_apart():
    long = "ä" * 100
    assert len(safe_name(long).encode()) <= MAX_NAME_BYTES
    assert safe_name(long + "1") != safe_name(long + "2")
    assert safe_name("b4-take2") == "b4-take2"


def test_a_case_id_of_many_non_ascii_letters_runs(engine):
    target = plain.with_options(cases=[{"name": "ä" * 100}])
    result = engine.run_cell(cell(target, target.cases[0], KillSpec(2)))
    assert result.verdict.findings == [], result.verdict.headline


def test_what_a_resume_names_outside_its_cell_is_not_kept(engine, tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "tree").mkdir(parents=True)
    (outside / "tree" / "file").write_text("not the run's")
    result = engine.run_cell(cell(plain, {"resumed_from": str(outside)}, KillSpec(2)))
    assert not list(Path(result.runs[1].plan.log_path).parent.glob("restored-*"))
    inside = engine.run_cell(cell(plain, {}, KillSpec(2)))  # its own checkpoint is kept as evidence
    assert (Path(inside.runs[1].plan.log_path).parent / "restored-run1" / "state.json").exists()


CRASHING_CONFTEST = """
import os
import trust_targets
from pytest_resume_check import resume_target

plain = resume_target(steps=trust_targets.STEPS, name="plain")(trust_targets.plain)


def pytest_resume_check_cell_result(config, result):
    if result.cell.kill_id == "ckpt2" and result.cell.resume_mode == "auto":
        os._exit(3)  # the xdist worker dies with the cell
"""


def test_a_crashed_xdist_worker_is_a_failing_cell_in_the_summary_and_the_json(pytester, monkeypatch):
    pytest.importorskip("xdist")
    pytester.makeconftest(CRASHING_CONFTEST)
    support = Path(__file__).resolve().parents[1] / "support"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("--resume-matrix", "-n", "2", "-p", "no:cacheprovider",
                                           "--resume-matrix-json=out.json", "--resume-matrix-seed=1")
    outcomes = result.parseoutcomes()
    failed = outcomes.get("failed", 0)
    assert failed >= 1
    result.stdout.fnmatch_lines([f"*resume matrix: * cells, {failed} failing, 0 expected failures, seed 1 *",
                                 "*plain?default-auto-ckpt2?: HARNESS: the pytest-xdist worker running this cell "
                                 "crashed*"])
    assert failed == 1  # the crashed cell is not run again (it would crash every replacement worker)
    cells = json.loads((pytester.path / "out.json").read_text())["cells"]
    assert len(cells) == outcomes["passed"] + failed
    crashed = [c for c in cells if c["status"] == HARNESS]
    assert [(c["resume_mode"], c["kill"]) for c in crashed] == [("auto", "ckpt2")]
    assert "worker 'gw" in crashed[0]["headline"] and "crashed while running" in crashed[0]["headline"]


SERVER_KILLING_CONFTEST = """
import trust_targets
from pytest_resume_check import resume_target

server_killer = resume_target(steps=trust_targets.STEPS, name="server_killer",
                              cases=[{"kill_server_at": 2}])(trust_targets.server_killer)
plain = resume_target(steps=trust_targets.STEPS, name="plain", crash_save=False)(trust_targets.plain)
"""


def test_a_session_whose_fork_server_keeps_dying_reports_each_cell_as_harness_and_ends(pytester, monkeypatch):
    """Every run of one target kills its fork server, at collection (recording its save) and in its cells: each
    is one HARNESS line, the other target's cells pass on the servers started after."""
    pytester.makeconftest(SERVER_KILLING_CONFTEST)
    support = Path(__file__).resolve().parents[1] / "support"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "--resume-matrix-seed=1",
                                           "--resume-matrix-json=out.json")
    result.stdout.fnmatch_lines(["*resume-matrix server_killer?record-save?*",
                                 "HARNESS: the fork server the runs start from (pid *) was killed by SIGKILL (the "
                                 "kernel's OOM killer sends this)*"])
    assert "crash_save=False" not in result.stdout.str()
    cells = json.loads((pytester.path / "out.json").read_text())["cells"]
    killers = [c for c in cells if c["target"] == "server_killer"]
    assert killers and all(c["status"] == HARNESS for c in killers)
    assert all(c["passed"] for c in cells if c["target"] == "plain")


STDIN_TARGET = """
import trust_targets as tt

from pytest_resume_check import resume_target

counted = resume_target(steps=tt.STEPS, name="counted")(tt.plain)
"""

STDIN_PROGRAM = '''
import sys
from pathlib import Path

from counted_target import counted
from pytest_resume_check.cells.matrix import cells
from pytest_resume_check.engine import Engine

if __name__ == "__main__":
    engine = Engine(Path(sys.argv[1]), seed=0)
    cell = cells(counted, "quick", 0)[0]
    engine.register([cell])
    print(engine.run_cell(cell).verdict.headline)
    engine.close()
    engine.stop_server()
'''


def program_env(folder: Path) -> dict[str, str]:
    """The environment a driving program of these tests runs in: its target module in ``folder``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(Path(tt.__file__).parent)])}


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_a_program_read_from_stdin_gets_one_line_that_names_its_main_file_not_a_bug(tmp_path, isolation):
    """multiprocessing makes every run its driving program starts run that program's main file again; read from
    standard input (``python -``), that is ``<cwd>/<stdin>``, so every run failed and the line blamed the harness
    (the fork server "died while importing the preload modules"). The same program from a file passes."""
    (tmp_path / "counted_target.py").write_text(STDIN_TARGET)
    program = STDIN_PROGRAM.replace("seed=0)", f"seed=0, isolation={isolation!r})")
    (tmp_path / "drive.py").write_text(program)
    env = program_env(tmp_path)
    from_file = subprocess.run([sys.executable, "drive.py", str(tmp_path / "a")], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
    assert from_file.stdout.strip().splitlines()[-1:] == ["PASSED"], from_file.stdout + from_file.stderr
    from_stdin = subprocess.run([sys.executable, "-", str(tmp_path / "b")], input=program, cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
    line = from_stdin.stdout.strip().splitlines()[-1]
    assert line == harness_errors.MSG_MAIN_NOT_A_FILE.format(path=tmp_path / "<stdin>"), line
    assert "bug of pytest-resume-check" not in from_stdin.stdout


def test_a_program_without_a_main_guard_is_told_to_add_one_and_its_own_cells_are_judged(tmp_path):
    """Each run multiprocessing starts runs its program's main file again first; without
    ``if __name__ == "__main__":`` that copy drives an engine of its own inside the run, whose runs cannot start
    (multiprocessing refuses). Its line said "a bug of pytest-resume-check"; it names the missing guard, and the
    program's own cell is judged as usual."""
    (tmp_path / "counted_target.py").write_text(STDIN_TARGET)
    head, body = STDIN_PROGRAM.split('if __name__ == "__main__":\n')
    (tmp_path / "drive.py").write_text(head + textwrap.dedent(body))
    env = program_env(tmp_path)
    done = subprocess.run([sys.executable, "drive.py", str(tmp_path / "a")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    assert lines[-1:] == ["PASSED"], done.stdout + done.stderr
    assert harness_errors.MSG_NO_MAIN_GUARD in lines, done.stdout
    assert "bug of pytest-resume-check" not in done.stdout
