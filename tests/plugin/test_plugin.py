"""Black-box tests of the pytest plugin: options, errors, items, failure reports, rerun commands."""

from __future__ import annotations

import importlib.util
import json
import shlex

import pytest

from pytest_resume_check.plugin import options
from pytest_resume_check.records import names

# That engine modules never import pytest is checked module by module in test_imports.py.


def test_loading_the_plugin_imports_neither_torch_nor_the_engine(pytester):
    pytester.makepyfile(
        """
        import sys
        def test_nothing_heavy_loaded():
            assert "torch" not in sys.modules
            assert "pytest_resume_check.engine" not in sys.modules
            assert "pytest_resume_check.process.runner" not in sys.modules
            assert "pytest_resume_check.process.supervisor" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume-matrix-mode=fast"], options.ERR_MODE.format(opt=names.OPT_MODE, value="fast")),
        (["--resume-matrix", "--resume-matrix-seed=abc"], options.ERR_SEED.format(opt=names.OPT_SEED, value="abc")),
        (["--resume-matrix", "--resume-matrix-hang-timeout=-1"],
         options.ERR_HANG.format(opt=names.OPT_HANG, value="-1")),
        (["--resume-matrix", "--resume-matrix-isolation=thread"],
         options.ERR_ISOLATION.format(opt=names.OPT_ISOLATION, value="thread")),
    ],
    ids=["mode", "seed", "hang-timeout", "isolation"],
)
def test_bad_option_values_are_usage_errors_that_name_the_fix(pytester, args, message):
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_unknown_target_name_lists_the_known_ones(pytester):
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix",
                                           "--resume-matrix-target=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no resume-check target named nope; known targets:*correct*"])


def test_seed_last_without_a_previous_run_says_what_to_do(pytester):
    result = pytester.runpytest_subprocess("--resume-matrix", "--resume-matrix-seed=last")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert options.ERR_SEED_LAST.format(opt=names.OPT_SEED) in result.stderr.str()


# The remaining tests run real targets: they need torch.
CONFTEST = """
from pytest_resume_check import resume_target
from pytest_resume_check.builtin import loop

PRELOAD = loop.PRELOAD
CASES = [{"id": "take2", "take": 2, "n": 8, "epochs": 2}]

correct = resume_target(loop.correct_loop, name="correct", steps=loop.total_steps, cases=CASES,
                        preload=PRELOAD)
drop = resume_target(loop.loop_drop_buffer, name="drop", steps=loop.total_steps, cases=CASES,
                     preload=PRELOAD, resume_modes=["auto"])
raising = resume_target(loop.loop_raise_on_resume, name="raising", steps=loop.total_steps, cases=CASES,
                        preload=PRELOAD, resume_modes=["auto"],
                        expected_failures=[(lambda cell: cell.kills[0].checkpoint_step > 0,
                                            "resume is known to raise")])
"""


def _installed(name):
    return importlib.util.find_spec(name) is not None


@pytest.fixture
def torch_project(pytester):
    # Only the child processes import torch. Importing it here would be undone by pytester's
    # sys.modules snapshot, and torch's C extension does not survive a second import.
    if not (_installed("torch") and _installed("torchdata")):
        pytest.skip("torch and torchdata are not installed")
    pytester.makeconftest(CONFTEST)
    return pytester


def test_correct_target_passes_every_cell_and_writes_json(torch_project):
    result = torch_project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-target=correct",
        "--resume-matrix-seed=3", "--resume-matrix-json=verdicts.json", "-m", "resume_matrix")
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] >= 8 + 4 and "failed" not in outcomes
    result.stdout.fnmatch_lines(["resume-check: matrix=quick seed=3*", "*resume matrix: * cells, 0 failing*"])
    data = json.loads((torch_project.path / "verdicts.json").read_text())
    assert data["seed"] == 3 and len(data["cells"]) == outcomes["passed"]
    for cell in data["cells"]:
        # entries are [id, step, epoch, run]; the run index differs by construction
        assert cell["passed"] and [e[:3] for e in cell["composite"]] == [e[:3] for e in cell["reference"]]


def test_ini_settings_work_like_the_command_line(torch_project):
    torch_project.makeini("[pytest]\nresume_matrix = quick\nresume_matrix_targets = correct\n"
                          "resume_matrix_seed = 11\n")
    result = torch_project.runpytest_subprocess("-p", "no:cacheprovider", "-m", "resume_matrix")
    result.stdout.fnmatch_lines(["resume-check: matrix=quick seed=11*"])
    assert result.ret == 0 and result.parseoutcomes()["passed"] >= 12


def test_failing_target_fails_the_session_with_headline_and_a_rerun_that_reproduces_it(torch_project):
    result = torch_project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-target=drop", "--resume-matrix-seed=5")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    headline = "LOST 2 inputs after resume from step_1: ids 2, 3 (epoch 0)"
    result.stdout.fnmatch_lines([f"*{headline}*", "*reference: 0@e0 1@e0 [[]2@e0[]]*", "*rerun: pytest *"])
    reruns = {line.strip() for line in result.outlines if "rerun:" in line and "ckpt1]'" in line}
    assert len(reruns) == 1, reruns  # the failure report and the summary give the same command
    rerun = reruns.pop()
    args = shlex.split(rerun.split("rerun: pytest", 1)[1])
    again = torch_project.runpytest_subprocess("-p", "no:cacheprovider", *args)
    again.assert_outcomes(failed=1, deselected=None)
    again.stdout.fnmatch_lines([f"*{headline}*"])


def test_known_failures_are_expected_failures_and_do_not_fail_the_session(torch_project):
    result = torch_project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-target=raising")
    outcomes = result.parseoutcomes()
    assert result.ret == 0
    assert outcomes["xfailed"] >= 8 and outcomes.get("passed", 0) >= 1 and "failed" not in outcomes


def test_junit_xml_carries_case_kill_and_verdict_of_each_cell(torch_project):
    torch_project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-target=drop", "--junitxml=out.xml")
    xml = (torch_project.path / "out.xml").read_text()
    assert '<property name="kill" value="ckpt1"' in xml
    # The loop reports its buffer: the restored state is the cause, the lost inputs follow it.
    assert '<property name="verdict" value="LOST,STATE_DIVERGED"' in xml
    assert '<property name="headline" value="STATE_DIVERGED at step 1 (the restored step of resume from step_1): ' \
           'buffer differs' in xml
    assert '<property name="case" value="take2"' in xml


def test_hand_written_test_with_the_fixture_sees_the_verdict(torch_project):
    torch_project.makepyfile(
        """
        import conftest

        def test_correct_resumes_exactly(resume_check):
            result = resume_check.run(conftest.correct, kills=[resume_check.kill_after_checkpoint(3)])
            assert result.passed, resume_check.report(result)
            assert result.verdict.composite.ids == result.verdict.reference.ids

        def test_dropped_buffer_is_lost(resume_check):
            result = resume_check.run(conftest.drop, kills=resume_check.kill_after_checkpoint(1))
            assert result.verdict.categories == ["LOST", "STATE_DIVERGED"]
            assert result.verdict.headline.startswith("STATE_DIVERGED at step 1 (the restored step")
            assert result.verdict.findings[1].headline.startswith("LOST 2 inputs")
        """
    )
    result = torch_project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


FORK_UNSAFE = """
import threading

LOCK = threading.Lock()
RELEASE = threading.Event()


def _hold():
    # A background thread owns LOCK until asked to let go. A process forked from an interpreter
    # that imported this module inherits the held lock but not the thread: it can never get it.
    with LOCK:
        RELEASE.wait()


threading.Thread(target=_hold, daemon=True).start()
while not LOCK.locked():
    pass


def train(run):
    RELEASE.set()
    with LOCK:
        run.resumed(0)
        run.consumed([0], step=1, epoch=0)
        run.step_end(1)
"""


def test_a_trainer_that_deadlocks_when_forked_is_reported_with_the_spawn_fix(pytester):
    pytester.makepyfile(forkunsafe=FORK_UNSAFE)
    pytester.makeconftest(
        "import forkunsafe\n"
        "from pytest_resume_check import resume_target\n"
        "t = resume_target(forkunsafe.train, name='forkunsafe', steps=1, preload=('forkunsafe',),"
        " resume_modes=['auto'])\n"
    )
    args = ("-p", "no:cacheprovider", "--resume-matrix", "--resume-matrix-target=forkunsafe",
            "--resume-matrix-hang-timeout=3", "-m", "resume_matrix")
    forked = pytester.runpytest_subprocess(*args)
    forked.stdout.fnmatch_lines(["*HUNG: the reference run sent no event at all*isolation='spawn'*"])
    spawned = pytester.runpytest_subprocess(*args, "--resume-matrix-isolation=spawn")
    assert spawned.ret == 0 and spawned.parseoutcomes()["passed"] >= 1


def test_a_hook_can_narrow_the_cases_of_a_target(torch_project):
    torch_project.makeconftest(CONFTEST.replace(
        'CASES = [{"id": "take2", "take": 2, "n": 8, "epochs": 2}]',
        'CASES = [{"id": "take2", "take": 2, "n": 8, "epochs": 2}, {"id": "take4", "take": 4, "n": 8}]',
    ) + """

def pytest_resume_check_cases(config, target):
    return [c for c in target.cases if c["id"] == "take4"] if target.name == "correct" else None
""")
    result = torch_project.runpytest_subprocess("-p", "no:cacheprovider", "--resume-matrix",
                                                "--resume-matrix-target=correct", "--collect-only", "-q")
    names = [line for line in result.outlines if line.startswith("resume-matrix::")]
    assert names and all("[take4-" in n for n in names)
    result.stdout.fnmatch_lines([f"{len(names)} tests collected*"])
