"""Hostile input: a bad option value or a broken target gets one clear error, and the rest of
the session still runs.

Each process test runs a tiny torch-free target, ``good``, beside the broken one and checks that its
cells still ran and passed. Runs no torch, so it also runs where only pytest is installed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from multiprocessing import Pipe
from multiprocessing.connection import wait
from pathlib import Path

import pytest

from pytest_resume_check import targets
from pytest_resume_check.plugin import items, settings, summary
from pytest_resume_check.process import fork_server, layout
from pytest_resume_check.process.layout import Layout, check_inside, remove_inside
from pytest_resume_check.process.runner import MAX_HANG_TIMEOUT, hang_limit
from pytest_resume_check.records import declaration, names

#: Two steps, a JSON checkpoint per step: three cells in quick mode with auto resume only.
TRAINER = """
import json

from pytest_resume_check.run import RESUME_DISABLED, RESUME_PATH

STEPS = 2


def train(run):
    start, folder = 0, None
    if run.resume_mode == RESUME_PATH:
        folder = run.resume_path
    elif run.resume_mode != RESUME_DISABLED and (run.checkpoint_dir / "latest").exists():
        folder = run.checkpoint_dir / (run.checkpoint_dir / "latest").read_text()
    if folder is not None:
        start = json.loads((folder / "state.json").read_text())["step"]
    run.resumed(start, folder)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step):
            saved = run.checkpoint_dir / f"step_{step}"
            saved.mkdir(exist_ok=True)
            (saved / "state.json").write_text(json.dumps({"step": step}))
            (run.checkpoint_dir / "latest").write_text(saved.name)
            run.checkpoint_published(step, saved)
"""

GOOD = """
from pytest_resume_check import resume_target
import trainer

good = resume_target(trainer.train, name="good", steps=trainer.STEPS, resume_modes=["auto"], crash_save=False)
"""
GOOD_CELLS = 3


def some_target(run):  # module level: targets must be importable by name
    pass


@pytest.fixture
def project(pytester, monkeypatch):
    """A project with the ``good`` target, its session files under a temporary folder of its own (with
    a short path: on Python 3.11 the fork server's socket lives there, and its path has a length limit)."""
    tmp = tempfile.mkdtemp(prefix="rc-")
    monkeypatch.setenv("TMPDIR", tmp)
    pytester.makepyfile(trainer=TRAINER)
    yield pytester
    shutil.rmtree(tmp, ignore_errors=True)


def run_matrix(pytester, *targets_, args=()):
    """The matrix of ``good`` and ``targets_`` (never the installed packages' targets)."""
    chosen = [f"--resume-matrix-target={name}" for name in ("good", *targets_)]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-seed=1",
                                         *chosen, *args)


# -- a preload module that fails to import ------------------------------------------------------------

#: (module, its code, the error reported), one target each.
BROKEN_PRELOADS = [
    ("raising", 'raise RuntimeError("preload exploded")', "RuntimeError: preload exploded (at *raising.py:1)"),
    ("exiting", "raise SystemExit(3)", "SystemExit: 3 (at *exiting.py:1)"),
    # Kills the fork server outright: the starter finds the module by importing each one alone.
    ("dying", "import os\nos._exit(7)", "importing it ended the interpreter with exit code 7"),
]


def test_a_preload_module_that_fails_fails_only_its_target_with_one_line_naming_it(project):
    conftest = GOOD
    for module, code, _ in BROKEN_PRELOADS:
        project.makepyfile(**{module: code})
        conftest += (f"{module} = resume_target(trainer.train, name='{module}', steps=trainer.STEPS, "
                     f"resume_modes=['auto'], preload=['{module}'])\n")
    project.makeconftest(conftest)
    result = run_matrix(project, *(module for module, _, _ in BROKEN_PRELOADS))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=GOOD_CELLS, failed=GOOD_CELLS * len(BROKEN_PRELOADS))
    result.stdout.fnmatch_lines_random(["TARGET_ERROR: " + fork_server.ERR_PRELOAD.format(target=module, module=module,
                                                                                      error=error)
                                        for module, _, error in BROKEN_PRELOADS])
    broken = GOOD_CELLS * len(BROKEN_PRELOADS)  # every cell of theirs is counted, as pytest counts it
    result.stdout.fnmatch_lines([f"*resume matrix: {GOOD_CELLS + broken} cells, {broken} failing,*"])
    assert "EOFError" not in result.stdout.str()


# -- a target whose own functions raise ---------------------------------------------------------------

BROKEN_FUNCTIONS = GOOD + """

def no_steps(case):
    raise ValueError("no steps today")


def no_boundaries(case):
    raise KeyError("epochs")


bad_steps = resume_target(trainer.train, name="bad_steps", steps=no_steps)
bad_boundaries = resume_target(trainer.train, name="bad_boundaries", steps=2, boundaries=no_boundaries)
zero_steps = resume_target(trainer.train, name="zero_steps", steps=lambda case: 0)
hooked = resume_target(trainer.train, name="hooked", steps=2)


def pytest_resume_check_cases(config, target):
    if target.name == "hooked":
        raise RuntimeError("no cases for you")
"""


def test_a_target_whose_functions_raise_gets_one_failing_item_and_the_other_targets_run(project):
    project.makeconftest(BROKEN_FUNCTIONS)
    result = run_matrix(project, "bad_steps", "bad_boundaries", "zero_steps", "hooked")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # not INTERNAL_ERROR: the session went on
    result.assert_outcomes(passed=GOOD_CELLS, failed=4)
    raised = "{} (at *conftest.py:*)"
    result.stdout.fnmatch_lines_random([
        declaration.ERR_RAISED.format(name="bad_steps", function="steps", case_id="default",
                                  error=raised.format("ValueError: no steps today")),
        declaration.ERR_RAISED.format(name="bad_boundaries", function="boundaries", case_id="default",
                                  error=raised.format("KeyError: 'epochs'")),
        declaration.ERR_STEPS_RETURNED.format(name="zero_steps", case_id="default", value=0),
        items.ERR_CASES_HOOK.format(name="hooked", error=raised.format("RuntimeError: no cases for you")),
    ])
    assert "INTERNALERROR" not in result.stdout.str()


# -- the hang limit -----------------------------------------------------------------------------------

#: Values a mistyped or hostile numeric option gets, and which of them each option accepts: only the hang
#: limit takes inf (no limit) and huge limits (cut to about 23 days), as matrix.md says.
ABSURD = ["inf", "nan", "1e308", "-1", "-inf"]
ACCEPTED = {settings.HANG.opt: {"inf", "1e308"}}


@pytest.mark.parametrize("value", ABSURD)
@pytest.mark.parametrize("option", settings.NUMERIC_OPTIONS, ids=lambda option: option.opt)
def test_every_numeric_option_refuses_absurd_values_with_one_usage_error_naming_it(pytester, option, value):
    # Refused while pytest configures, before any run (none is asked for here): in process is enough.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"{option.opt}={value}")
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    if value in ACCEPTED.get(option.opt, ()):
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, output
        return
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    message = option.error.format(opt=option.opt, value=value)
    assert message in result.stderr.str()
    high = "inf" if option.high == math.inf else f"{option.high:,}"
    assert f"{option.opt}={value!r}" in message and f"from {option.low:g} to {high}" in message


@pytest.mark.parametrize("option", settings.NUMERIC_OPTIONS, ids=lambda option: option.opt)
def test_every_numeric_option_takes_the_ends_of_its_range_from_the_command_line_or_the_ini_file(option):
    for end in (option.low, option.high):
        given = str(int(end)) if option.whole else str(end)
        assert settings.check_number(option, given, option.opt) == end
    with pytest.raises(pytest.UsageError, match=f"^ini {option.ini}='x'"):
        settings.check_number(option, "x", f"ini {option.ini}")


def test_a_basetemp_whose_parent_folder_is_missing_is_one_usage_error_naming_it(project):
    project.makeconftest(GOOD)
    missing = project.path / "no-such-folder" / "deeper"
    result = run_matrix(project, args=[f"--basetemp={missing / 'bt'}"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: the resume matrix cannot make its session folder in {missing / 'bt'} "
                                 f"(No such file or directory); create {missing} or give a --basetemp *"])


@pytest.mark.parametrize("value", ["inf", "1e7"])  # 0 is inf (see the unit tests below)
def test_no_hang_limit_and_a_huge_one_run_the_matrix(project, value):
    project.makeconftest(GOOD)
    result = run_matrix(project, args=[f"{names.OPT_HANG}={value}"])
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=GOOD_CELLS)


@pytest.mark.parametrize(("seconds", "limit"), [(60, 60), (0, MAX_HANG_TIMEOUT), (math.inf, MAX_HANG_TIMEOUT),
                                                (1e7, MAX_HANG_TIMEOUT)])
def test_hang_limits_become_ones_the_process_layer_accepts(seconds, limit):
    assert hang_limit(seconds) == limit


@pytest.mark.parametrize("seconds", [math.nan, -1])
def test_a_hang_limit_below_zero_or_nan_is_refused_by_the_engine_too(seconds):
    with pytest.raises(ValueError, match="number of seconds"):
        hang_limit(seconds)


def test_the_longest_hang_limit_is_one_a_wait_for_events_accepts():
    reader, writer = Pipe(duplex=False)
    writer.send_bytes(b"event")
    assert wait([reader], timeout=MAX_HANG_TIMEOUT)  # unclamped, 1e7 s raised OverflowError here


# -- declarations -------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", [0, -3, True])
def test_a_number_of_steps_below_one_is_refused_at_declaration(steps):
    with pytest.raises(targets.TargetError) as raised:
        targets.resume_target(some_target, name="few", steps=steps)
    assert str(raised.value) == declaration.ERR_STEPS.format(name="few", steps=steps)


@pytest.mark.parametrize(("name", "problem"), [
    ("..", "is '..'"), (".", "is '.'"), ("up/../../x", "contains a path separator"),
    ("a\\b", "contains a path separator"), ("a\0b", "contains a NUL character"),
])
def test_a_target_name_that_is_not_a_plain_folder_name_is_refused_at_declaration(name, problem):
    with pytest.raises(targets.TargetError) as raised:
        targets.resume_target(some_target, name=name, steps=2)
    assert str(raised.value) == declaration.ERR_TARGET_NAME.format(name=name, problem=problem)


@pytest.mark.parametrize("case_id", ["..", "../escape", ""])
def test_a_case_id_that_is_not_a_plain_folder_name_is_refused_at_declaration(case_id):
    with pytest.raises(targets.TargetError, match="case id"):
        targets.resume_target(some_target, name="cased", steps=2, cases=[{"id": case_id}])


def test_cases_that_raise_while_read_are_refused_at_declaration_naming_the_target():
    def cases():
        yield {"id": "one"}
        raise OSError("cases file is gone")

    with pytest.raises(targets.TargetError, match=r"target 'cased': reading its cases raised OSError: cases file"):
        targets.resume_target(some_target, name="cased", steps=2, cases=cases())


DOTS = GOOD + """
dots = good.with_options(name="..")  # past the declaration's checks
sneaky = resume_target(trainer.train, name="sneaky", steps=2)


def pytest_resume_check_cases(config, target):
    if target.name == "sneaky":
        return [{"id": ".."}]
"""


def test_names_that_would_leave_the_session_root_fail_their_target_and_delete_nothing_outside(project):
    tmp = Path(os.environ["TMPDIR"])
    canaries = [where / name for where in (tmp, project.path) for name in ("canary", "default/canary")]
    for canary in canaries:
        canary.parent.mkdir(exist_ok=True)
        canary.write_text("still here")
    project.makeconftest(DOTS)
    result = run_matrix(project, "..", "sneaky")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=GOOD_CELLS, failed=2)
    result.stdout.fnmatch_lines_random([
        declaration.ERR_TARGET_NAME.format(name="..", problem="is '..'"),
        declaration.ERR_CASE_ID.format(name="sneaky", case_id="..", problem="is '..'"),
    ])
    assert all(canary.read_text() == "still here" for canary in canaries)


# -- deletions are proven to stay inside their root ---------------------------------------------------

@pytest.mark.parametrize("inside", ["a", "a/b/c", "a/./b"])
def test_a_path_spelled_below_the_root_is_inside(tmp_path, inside):
    assert check_inside(tmp_path / inside, tmp_path) == tmp_path / inside


@pytest.mark.parametrize("outside", ["", "..", "../sibling", "a/../..", "a/../b"])
def test_a_path_that_climbs_or_is_the_root_is_refused(tmp_path, outside):
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="refusing to delete"):
        check_inside(tmp_path / outside, tmp_path)


def test_a_symlink_out_of_the_root_is_refused_and_what_it_points_at_survives(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "canary").write_text("still here")
    (root / "link").symlink_to(elsewhere, target_is_directory=True)
    for delete in (lambda: Layout(root).fresh(root / "link" / "cell"), lambda: Layout(root).remove(root / "link"),
                   lambda: remove_inside(root / "link", root, ignore_errors=True)):
        with pytest.raises(ValueError, match=layout.ERR_OUTSIDE.split(":")[0].format(path=".*")):
            delete()
    assert (elsewhere / "canary").read_text() == "still here"


def test_fresh_and_remove_delete_inside_the_root(tmp_path):
    folder = Layout(tmp_path).fresh(tmp_path / "t" / "case" / "cell")
    (folder / "file").write_text("x")
    assert list(Layout(tmp_path).fresh(folder).iterdir()) == []
    Layout(tmp_path).remove(folder)
    assert not folder.exists() and (tmp_path / "t" / "case").is_dir()


# -- report files that cannot be written --------------------------------------------------------------

def test_a_report_path_that_cannot_be_written_says_so_and_the_matrix_result_stands(project):
    project.makeconftest(GOOD)
    (project.path / "blocker").write_text("a file where a folder should be")
    json_path, html_path = "blocker/sub/verdicts.json", "blocker/sub/report.html"
    result = run_matrix(project, args=[f"{names.OPT_JSON}={json_path}", f"{names.OPT_HTML}={html_path}"])
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=GOOD_CELLS)
    result.stdout.fnmatch_lines([
        summary.ERR_REPORT_WRITE.format(kind="JSON", path=Path(json_path), reason="Not a directory",
                                        opt=names.OPT_JSON),
        summary.ERR_REPORT_WRITE.format(kind="HTML", path=html_path, reason="Not a directory", opt=names.OPT_HTML),
    ])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


# -- a trainer's words on the terminal ----------------------------------------------------------------

HOSTILE_WORDS = GOOD + '''
import hostile

escapes = resume_target(hostile.escapes, name="escapes", steps=trainer.STEPS, resume_modes=["auto"],
                        crash_save=False)
nosource = resume_target(hostile.go, name="nosource", steps=trainer.STEPS, resume_modes=["auto"],
                         crash_save=False)
'''

#: A target raising an error that sets the terminal's title and clears it, and one raising in a frame of a
#: module whose loader raises when the traceback asks for its source.
HOSTILE = """
import trainer


def escapes(run):
    trainer.train(run)
    raise RuntimeError("bad \\x1b]0;title\\x07 and \\x1b[2J clear")


class NoSource:
    def get_source(self, name):
        raise ValueError("source is not readable today")


__loader__ = NoSource()
exec(compile("def go(run):\\n    trainer.train(run)\\n    raise RuntimeError('from a frame with no source')\\n",
             "/nonexistent/hostile_virtual.py", "exec"), globals())
"""


def test_a_trainers_words_reach_the_terminal_as_text_and_a_hostile_frame_still_names_its_error(project):
    project.makepyfile(hostile=HOSTILE)
    project.makeconftest(HOSTILE_WORDS)
    result = run_matrix(project, "escapes", "nosource", args=["--resume-matrix-json=cells.json"])
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.assert_outcomes(passed=GOOD_CELLS, failed=2 * GOOD_CELLS)
    assert "\x1b" not in output and "\x07" not in output
    raised = "*CRASHED: the reference run raised RuntimeError: {}"
    result.stdout.fnmatch_lines([raised.format("bad \\x1b]0;title\\x07 and \\x1b[2J clear")])
    result.stdout.fnmatch_lines([raised.format("from a frame with no source")])  # not "died by itself"
    assert "Process resume-check" not in output  # multiprocessing's traceback of the harness's own failure
    cells = json.loads((project.path / "cells.json").read_text())["cells"]
    assert {c["headline"] for c in cells if c["target"] == "escapes"} == {
        "CRASHED: the reference run raised RuntimeError: bad \x1b]0;title\x07 and \x1b[2J clear"}  # raw in JSON
