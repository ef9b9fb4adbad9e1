"""A Python program a command target runs in the run's process is judged as the same program in a fresh
interpreter (``fresh_interpreter=True``): a differential test over a small corpus of programs that end their
process in the ways real scripts do (a forked child that exits or raises, ``os._exit`` at several points,
``exec``, a closed ``sys.stdout``, an exit function that raises, ``chdir`` and ``__file__``, ``sys.argv``, a
multiprocessing child or a thread that delivers the program's output after its main returned, a variable a
preloaded module read when imported, signal handlers, warning filters, faulthandler, resource limits).

Each program is declared twice, run on the same cells both ways, and every cell's verdict categories and
headline must be equal. Headlines may differ only in the run folders they name: the engine's folder and the
target's name (which differ between the two declarations, so they share no reference) are replaced by
placeholders before the comparison, and nothing else is.
"""

from __future__ import annotations

import signal
from pathlib import Path

import fresh_equivalence_program
import pytest
import reads_setting_at_import

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.child.command import python_program
from pytest_resume_check.engine import Engine
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "fresh_equivalence_program.py"
SETTING_MODULE = "reads_setting_at_import"
MODES = ("plain", "fork_exit", "fork_raise", "fork_early", "exit_after_last", "exit_mid", "exit_code",
         "exit_on_resume", "chdir_file", "stdout_closed", "exec_wrapper", "argv", "atexit_raises", "zc_plain",
         "zc_fork_exit", "mp_output", "mp_output_diverges", "env_at_import", "mp_joined", "thread_output", "signals",
         "warnings", "faulthandler", "rlimit")
#: A kill right after the checkpoint of step 2, and one step after it (a resume that redoes a step); each cell
#: runs the uninterrupted reference too.
CELLS = {"ckpt2": (KillSpec(2),), "ckpt2+1": (KillSpec(2, 1),)}
#: Programs a fresh interpreter passes on every cell (the others fail alike both ways).
PASSING = {"plain", "fork_exit", "fork_raise", "fork_early", "exit_after_last", "chdir_file", "stdout_closed",
           "exec_wrapper", "argv", "atexit_raises", "zc_plain", "zc_fork_exit", "mp_output",
           "env_at_import", "mp_joined", "thread_output", "signals", "warnings", "faulthandler", "rlimit"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("equivalence"), seed=3, hang_timeout=30)


def declared(mode: str, fresh: bool):
    name = f"{mode}_{'fresh' if fresh else 'in_process'}"
    checkpoints = "step_*.json" if mode.startswith("zc_") else None  # a program that reports nothing
    outputs = ("model.json",) if mode.startswith("mp_") or mode == "thread_output" else ()
    # A module the fork server imports, reading at its import a variable the target sets.
    preload, env = ((SETTING_MODULE,), {reads_setting_at_import.NAME: "on"}) if mode == "env_at_import" else ((), {})
    if mode == "signals":  # what its runs inherit from this process, through the fork server it starts
        env = {fresh_equivalence_program.IGNORED_ENV: ",".join(ignored_signals())}
    target = resume_target.command(["{python}", PROGRAM.name, mode, "{checkpoint_dir}"], name=name, steps=4,
                                   cwd=PROGRAM.parent, fresh_interpreter=fresh, checkpoints=checkpoints,
                                   outputs=outputs, preload=preload, env=env)
    assert (python_program(target.command) is None) is fresh  # really the two paths
    return target


def ignored_signals() -> list[str]:
    """The signals this process ignores, by name: a background job of a shell script ignores SIGINT and SIGQUIT,
    and so do the runs, in a fresh interpreter or not (an ignored signal stays so through ``exec``)."""
    return [s.name for s in signal.valid_signals()
            if isinstance(s, signal.Signals) and signal.getsignal(s) == signal.SIG_IGN]


def normalised(headline: str, engine: Engine, name: str) -> str:
    """The headline with the run folders it may name made alike: the engine's folder and the target's name."""
    return headline.replace(str(engine.root), "<root>").replace(name, "<target>")


@pytest.mark.parametrize("mode", MODES)
def test_a_program_in_the_runs_process_is_judged_as_in_a_fresh_interpreter(engine, mode):
    seen = {}
    for fresh in (False, True):
        target = declared(mode, fresh)
        for cell, kills in CELLS.items():
            result = engine.run_cell(Cell(target, {}, "auto", kills, target.steps({})))
            verdict = result.verdict
            seen[fresh, cell] = (verdict.passed, verdict.categories,
                                 normalised(verdict.headline, engine, target.name))
    for cell in CELLS:
        assert seen[False, cell] == seen[True, cell], cell
        assert seen[True, cell][0] is (mode in PASSING), seen[True, cell]


@pytest.mark.parametrize("mode", ["fork_exit", "fork_raise"])
def test_a_process_the_program_forks_never_reports_the_runs_end(engine, tmp_path, mode):
    """A child the program forks after step 1, whose code ends (``sys.exit``, an error), ends as a fresh
    interpreter's child would: the run's end (done, or the error) is reported once, by the run's own process,
    after the program's last step."""
    from pytest_resume_check.process.layout import Layout
    from pytest_resume_check.records import events as ev

    target = declared(mode, fresh=False)
    plan = engine.runner.plan(target, {}, Layout(tmp_path).fresh(tmp_path / target.name), 0)
    record = engine.runner.run(plan, target)
    ends = [e.kind for e in record.events if e.kind in (ev.DONE, ev.ERROR)]
    steps = [e.step for e in record.events if e.kind == ev.STEP_END]
    assert (record.outcome, ends, steps) == ("done", [ev.DONE], [1, 2, 3, 4]), record.error


def test_a_variable_a_preloaded_module_read_sends_its_target_to_a_fresh_interpreter_with_a_note(engine):
    """``env=`` giving another value to a variable that a module the fork server imported read at its import:
    the program runs in a fresh interpreter, and the cell and the session's summary say which variable and
    why; a variable nothing read there keeps the program in the run's process."""
    from pytest_resume_check.report.summary import fresh_interpreters
    from pytest_resume_check.report.text import RAN_FRESH_KEY, cell_json, environment_json

    target = declared("env_at_import", fresh=False)
    result = engine.run_cell(Cell(target, {}, "auto", CELLS["ckpt2"], target.steps({})))
    assert result.verdict.passed, result.verdict.headline
    assert environment_json(result)[RAN_FRESH_KEY] == [reads_setting_at_import.NAME]
    line, blank = fresh_interpreters([cell_json(result)])
    assert blank == "" and line.startswith(f"{target.name}: ran in a fresh interpreter")
    assert reads_setting_at_import.NAME in line

    unread = resume_target.command(["{python}", PROGRAM.name, "plain", "{checkpoint_dir}"], name="unread_env",
                                   steps=4, cwd=PROGRAM.parent, env={"RESUME_CHECK_NOBODY_READS_THIS": "1"},
                                   preload=(SETTING_MODULE,))
    result = engine.run_cell(Cell(unread, {}, "auto", CELLS["ckpt2"], unread.steps({})))
    assert result.verdict.passed and environment_json(result)[RAN_FRESH_KEY] == []
