"""Fast without tuning: the fork server imports the module that declares a target and
pays torch's first-use costs when torch is in use, so a target declared with no ``preload`` starts its
runs as a tuned one does; what it cannot preload costs nothing but the speed; and when runs still spend
most of their time starting, the session's last line says so.

Every session is a subprocess: the fork server's state lives in the process that starts it. No timing is
asserted: each run leaves a file saying what was loaded when its target started, and the conftest a file
per process that imported it.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile

import pytest

from pytest_resume_check.plugin import summary

#: The folder the targets write to (in the environment of the session).
PROBE_ENV = "AUTO_PRELOAD_PROBE"

#: The start of each conftest: notes that this process imported it, and defines the probe. A run's file
#: ``run-<pid>-<'torch' loaded>-<'torch._dynamo' loaded>`` is written before its first step.
PROBE = """
import os
import sys
from pathlib import Path

PROBE = Path(os.environ["AUTO_PRELOAD_PROBE"])
(PROBE / f"import-{os.getpid()}").touch()


def probe():
    (PROBE / f"run-{os.getpid()}-{'torch' in sys.modules}-{'torch._dynamo' in sys.modules}").touch()
"""

#: A torch-free trainer of two steps with a JSON checkpoint per step (three cells, auto resume only).
LOOP = """
import json


def train(run):
    probe()
    start, folder = 0, None
    if (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
        start = json.loads((folder / "state.json").read_text())["step"]
    run.resumed(start, folder)
    for step in range(start + 1, 3):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            saved = run.checkpoint_dir / f"step_{step}"
            saved.mkdir(exist_ok=True)
            (saved / "state.json").write_text(json.dumps({"step": step}))
            (run.checkpoint_dir / "latest").write_text(saved.name)
            run.checkpoint_published(step, saved)
"""

DECLARE = """
from pytest_resume_check import resume_target

t = resume_target(train, name="t", steps=2, resume_modes=["auto"], crash_save=False{options})
"""

#: Raises only in the fork server: neither pytest (which has ``_pytest`` loaded) nor a run (the leader of
#: its own process group when it imports its target's module) is affected.
ONLY_IN_SERVER = """
if os.getpgid(0) != os.getpid() and "_pytest" not in sys.modules:
    {action}
"""


def _needs_torch():
    # Only the children import torch: importing it here would be undone by pytester's sys.modules
    # snapshot, and torch's C extension does not survive a second import.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


@pytest.fixture
def project(pytester, monkeypatch):
    """A project whose targets write to a probe folder; its session files under a short temporary folder
    (the fork server's socket path has a length limit)."""
    tmp = tempfile.mkdtemp(prefix="rc-")
    monkeypatch.setenv("TMPDIR", tmp)
    probe = pytester.path / "probe"
    probe.mkdir()
    monkeypatch.setenv(PROBE_ENV, str(probe))
    yield pytester
    shutil.rmtree(tmp, ignore_errors=True)


def run_matrix(pytester):
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--resume-matrix",
                                           "--resume-matrix-seed=1", "--resume-matrix-target=t")
    return result


def runs(pytester):
    """(pid, torch loaded, torch._dynamo loaded) of each run, as its target started."""
    found = []
    for path in (pytester.path / "probe").glob("run-*"):
        _, pid, torch, dynamo = path.name.split("-")
        found.append((int(pid), torch == "True", dynamo == "True"))
    assert found
    return found


def importers(pytester):
    return {int(p.name.split("-")[1]) for p in (pytester.path / "probe").glob("import-*")}


def conftest(*parts, options=""):
    return "\n".join((PROBE, *parts, DECLARE.format(options=options)))


def test_a_target_declared_without_preload_starts_with_its_module_and_torch_warmed_up(project):
    _needs_torch()
    project.makeconftest(conftest("import torch", LOOP))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    started = runs(project)
    assert all(torch and dynamo for _, torch, dynamo in started)  # torch's first step paid in the server
    assert not importers(project) & {pid for pid, _, _ in started}  # no run imported the conftest again


def test_with_auto_preload_off_each_run_imports_its_module_itself(project):
    _needs_torch()
    project.makeconftest(conftest("import torch", LOOP, options=", auto_preload=False"))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    started = runs(project)
    assert {pid for pid, _, _ in started} <= importers(project)
    assert not any(dynamo for _, _, dynamo in started)


def test_a_torch_free_target_gets_no_torch_imported(project):
    project.makeconftest(conftest(LOOP))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    started = runs(project)
    assert not any(torch for _, torch, _ in started)
    assert not importers(project) & {pid for pid, _, _ in started}  # its module is preloaded all the same


@pytest.mark.parametrize("action", [
    'raise RuntimeError("not in the fork server")',
    "import time, threading; threading.Thread(target=time.sleep, args=(600,), daemon=True).start()",
], ids=["raises", "starts-a-thread"])
def test_a_module_the_server_cannot_preload_costs_nothing_but_the_speed(project, action):
    # A thread in the server would be inherited by no run but its locks would: the server starts again
    # without the module. Either way each run imports it itself, as with ``auto_preload=False``, and no error is new.
    project.makeconftest(conftest(ONLY_IN_SERVER.format(action=action), LOOP))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    assert {pid for pid, _, _ in runs(project)} <= importers(project)
    assert "Warning" not in result.stdout.str() and "TARGET_ERROR" not in result.stdout.str()


def test_why_a_module_was_not_preloaded_is_said_in_the_time_note(project):
    # The note's thresholds at zero (set in the session's process, which prints the note): it always shows.
    project.makeconftest(conftest(
        ONLY_IN_SERVER.format(action='raise RuntimeError("not in the fork server")'),
        "from pytest_resume_check.plugin import summary as _summary\n"  # imports pytest: after the check
        "_summary.NOTE_SHARE = _summary.NOTE_MEDIAN = _summary.NOTE_TOTAL = 0.0\n", LOOP))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["resume-check: runs spent *% of their time before their first step*"
                                 "not preloaded by itself: conftest: RuntimeError: not in the fork server*"])


def test_an_unseeded_trainer_is_still_nondeterministic_when_its_torch_is_preloaded(project):
    # A run that imported torch itself started from a seed of its own; forked from a server that imported
    # torch, it would start from the server's. The automatic preload must change speed, not verdicts.
    _needs_torch()
    draw = "        run.consumed([step], step=step, epoch=0)\n"
    project.makeconftest(conftest("import torch", LOOP.replace(draw, draw + "        torch.randn(3)\n")))
    result = run_matrix(project)
    result.stdout.fnmatch_lines(["*NONDETERMINISTIC reference*torch CPU RNG differs*"])


def test_runs_that_start_slowly_get_one_line_saying_where_the_time_went(project):
    project.makeconftest(conftest(
        "from pytest_resume_check.plugin import summary as _summary\n"
        "_summary.NOTE_MEDIAN, _summary.NOTE_TOTAL = 0.2, 0.5\n",
        LOOP.replace("    probe()\n", "    probe()\n    import time; time.sleep(0.3)\n")))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)  # never a verdict
    notes = [line for line in result.outlines if "before their first step" in line]
    assert len(notes) == 1 and notes[0] == result.outlines[-2]  # the last line before pytest's own
    assert "preload=(" in notes[0]


def test_runs_that_start_fast_get_no_time_note(project):
    project.makeconftest(conftest(LOOP))
    result = run_matrix(project)
    result.assert_outcomes(passed=3)
    assert "before their first step" not in result.stdout.str()


# -- the note's rule, on figures ----------------------------------------------------------------------

def costs(starts, seconds, auto=True, notes=()):
    return {"targets": {"t": {"starts": starts, "seconds": seconds, "auto_preload": auto}},
            "not_preloaded": list(notes)}


@pytest.mark.parametrize(("starts", "seconds"), [
    ([2.0] * 10, 21.0),  # the untuned loop without auto_preload: most of its time, a per-run import
])
def test_the_note_shows_when_start_up_is_most_of_the_time_and_slow(starts, seconds):
    note = summary.time_note(costs(starts, seconds))
    assert note == summary.TIME_NOTE.format(share=20 / 21, median=2.0, where="", why="")
    assert note.startswith("resume-check: runs spent 95% of their time before their first step (median 2.0 s)")


@pytest.mark.parametrize(("starts", "seconds"), [
    ([0.3] * 50, 18.0),  # a tuned loop: starting is most of its time, but fast
    ([2.0] * 10, 60.0),  # slow to start, but the steps take most of the time
    ([2.0] * 3, 6.5),  # slow, but too little in all to be worth a line
    ([], 0.0),
], ids=["fast-starts", "long-steps", "little-in-all", "no-runs"])
def test_the_note_stays_quiet_otherwise(starts, seconds):
    assert summary.time_note(costs(starts, seconds)) is None
    assert summary.time_note(None) is None


def test_the_note_names_the_slowest_target_and_what_kept_it_from_being_preloaded():
    figures = costs([2.0] * 10, 21.0, auto=False, notes=["conftest: ImportError: no module named x"])
    figures["targets"]["quick"] = {"starts": [1.5] * 4, "seconds": 6.5, "auto_preload": True}
    note = summary.time_note(figures)
    assert note is not None
    assert summary.TIME_NOTE_WHERE.format(target="t") in note
    assert summary.TIME_NOTE_WHY.format(notes="conftest: ImportError: no module named x") in note
    assert note.endswith(summary.TIME_NOTE_MANUAL.format(targets="'t'"))


def test_for_a_command_target_the_note_says_no_preload_helps():
    """A command target whose program is a process of its own starts afresh every run (the zero-change recipe as
    a fresh interpreter: 2.3 s of torch import a run): advising preload= would send the user the wrong way."""
    figures = costs([2.3] * 10, 27.0)
    figures["targets"]["t"]["command"] = True
    note = summary.time_note(figures)
    assert note == summary.TIME_NOTE_COMMAND.format(share=23 / 27, median=2.3, where="")
    assert "preload=" not in note and "no preload spares" in note


def test_the_note_names_what_the_runs_of_the_slowest_target_imported_themselves():
    figures = costs([2.0] * 10, 21.0)
    figures["targets"]["t"]["imported"] = ["torch", "transformers"]
    note = summary.time_note(figures)
    assert note == summary.TIME_NOTE_IMPORTED.format(share=20 / 21, median=2.0, where="", why="",
                                                     preload='("torch", "transformers")')
    assert 'preload=("torch", "transformers") would import it once' in note
    assert summary.preload_tuple(["torch"]) == '("torch",)'  # a tuple as written in Python
