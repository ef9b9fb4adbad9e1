"""Command targets: a program started per run, reporting through ``pytest_resume_check.client`` or the
line protocol, is killed, resumed and judged like a Python target.

The bundled ``script_example`` (a plain Python script, no torch) passes kills after a checkpoint, unsaved
steps, an epoch boundary, a double kill and a crash inside its save (the client records the program's
own file operations); its planted bugs fail for their reasons; the recipe project (the script and a
bash trainer that speaks the protocol by hand) passes its matrix; a program that reports nothing,
fails, garbles the protocol or leaves a process behind gets a clear verdict and nothing survives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_resume_check.builtin.targets import script_example
from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.client import FD_ENV
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.faults import MODE_CRASH, MODE_POWER, FaultPlan
from pytest_resume_check.records.plan import CommandSpec
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import TargetError, resume_target

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "docs" / "examples" / "recipes" / "command"
PROGRAMS = Path(__file__).resolve().parents[1] / "support" / "command_programs.py"
SHUFFLED = script_example.cases[1]
STEPS = 12


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("command"), seed=7, hang_timeout=30)


def planted(bug: str):
    spec = script_example.command
    return script_example.with_options(name=f"script_{bug}",
                                       command=CommandSpec(spec.argv + ("--plant", bug), spec.cwd, spec.env))


def program(mode: str, steps: int = 2):
    return resume_target.command(["{python}", str(PROGRAMS), mode, "{checkpoint_dir}"], name=f"program_{mode}",
                                 steps=steps)


def judge(engine, target, case, *kills, mode="auto"):
    return engine.run_cell(Cell(target, case, mode, tuple(kills), target.steps(case)))


@pytest.mark.parametrize("mode", ["auto", "path"])
@pytest.mark.parametrize("kills", [(KillSpec(2),), (KillSpec(3, 2),), (KillSpec(6),), (KillSpec(6, 1),),
                                   (KillSpec(2), KillSpec(7, 1))], ids=["ckpt2", "ckpt3+2", "ckpt6", "ckpt6+1",
                                                                       "ckpt2_ckpt7+1"])
def test_script_example_resumes_exactly(engine, kills, mode):
    result = judge(engine, script_example, SHUFFLED, *kills, mode=mode)
    assert result.passed, result.verdict.headline
    assert len(result.runs) == len(kills) + 1  # really killed and resumed, once per kill


def test_loader_position_not_restored_is_duplicated(engine):
    result = judge(engine, planted("loader"), SHUFFLED, KillSpec(2, 1))
    assert result.verdict.categories == [vd.DUPLICATED]
    assert result.verdict.headline.startswith("DUPLICATED 8 inputs after resume from step_2.json")
    assert judge(engine, script_example, SHUFFLED, KillSpec(2, 1)).passed


def test_optimizer_state_not_restored_is_state_diverged(engine):
    result = judge(engine, planted("optimizer"), SHUFFLED, KillSpec(2, 1), mode="path")
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert "momentum differs" in result.verdict.headline and "position agrees" in result.verdict.headline


def test_the_client_records_the_programs_own_save_and_crash_cells_judge_it(engine):
    case = script_example.cases[0]
    ops = engine.record_ops(script_example, case, 2, 1)
    kinds = [op.kind for op in ops]
    assert kinds[0] == "open" and "fsync" in kinds and "replace" in kinds  # seen inside the program
    replace = kinds.index("replace")
    for fault in (FaultPlan(2, MODE_CRASH, replace, total=len(ops)),
                  FaultPlan(2, MODE_POWER, len(ops), total=len(ops))):
        result = judge(engine, script_example, case, KillSpec(2, 0, fault))
        assert result.passed, (fault, result.verdict.headline)
        assert result.runs[0].outcome == "killed"


def test_client_outside_the_harness_does_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != FD_ENV}
    done = subprocess.run([sys.executable, "-m", "pytest_resume_check.builtin.train_script", "--out", str(tmp_path),
                           "--save-every", "6"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("trained 12 steps")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_12.json", "step_6.json"]


def test_client_imports_the_standard_library_only():
    code = ("import sys, pytest_resume_check.client; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pytest', '_pytest', 'torch', 'numpy'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_program_that_reports_nothing_is_an_error_not_a_pass(engine):
    result = judge(engine, program("silent"), {}, KillSpec(1))
    assert result.verdict.categories == [vd.CRASHED]
    assert "exited with code 0 without reporting anything" in result.verdict.headline
    assert "client.connect()" in result.verdict.headline


def test_a_failing_program_is_quoted_in_the_error(engine):
    result = judge(engine, program("fails"), {}, KillSpec(1))
    assert result.verdict.categories == [vd.CRASHED]
    assert result.verdict.headline.endswith("exited with code 3")
    assert "loading data from /nowhere" in result.reference.error


def test_a_garbled_line_is_a_protocol_finding_and_the_program_is_told(engine):
    result = judge(engine, program("garbled"), {}, KillSpec(1))
    assert result.verdict.categories == [vd.PROTOCOL]
    assert "run sent 'step 1 done', which is not a call of the protocol" in result.verdict.headline
    assert "answer: {'ok': False, 'error':" in Path(result.reference.plan.log_path).read_text()


def test_a_process_the_program_leaves_behind_is_gone_after_the_run(engine, tmp_path):
    result = judge(engine, program("escapes"), {}, KillSpec(0, 1))
    pid_file = Path(result.runs[0].plan.checkpoint_dir).parent / "sleeper.pid"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the program's own-session process survived the run"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("argv, cwd, words", [
    ("python train.py", None, "give the command as a list of arguments"),
    (["{python}", "train.py", "{out}"], None, "names {out}, which is not a placeholder"),
    (["{python}", "{case[lr]}"], None, "reads case key 'lr', which case {} does not have"),
    (["{python}", "train.py"], "no-such-folder", "is not a folder"),
])
def test_declaration_errors_name_the_fix(argv, cwd, words):
    with pytest.raises(TargetError, match="command target 'bad'") as info:
        resume_target.command(argv, name="bad", steps=2, cwd=cwd)
    assert words in str(info.value)


def test_recipe_project_passes_and_a_planted_bash_bug_is_caught(pytester):
    for name in ("conftest.py", "train.sh"):
        shutil.copy(RECIPE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    # 40 cells of each target, and the default crash smoke cells of the Python script (whose client sees its
    # file operations; the bash program's are not seen, so it gets none).
    result.stdout.fnmatch_lines(["*resume matrix: 83 cells, 0 failing, 0 expected failures, seed *"])
    script = (pytester.path / "train.sh").read_text()
    restore = 'read -r step epoch pos w < "$source"; fi'
    assert restore in script
    (pytester.path / "train.sh").write_text(script.replace(restore, restore + "\npos=0  # planted: epoch restarts"))
    result = pytester.runpytest_subprocess("--resume-matrix", "--resume-matrix-target=bash_trainer",
                                           "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*bash_trainer[[]in-order-auto-ckpt2[]]: DUPLICATED 4 inputs after resume from "
                                 "*step_2.ckpt: ids 0, 1, 2, 3 (epoch 0)*"])


RANK_PROGRAM = Path(__file__).resolve().parents[1] / "support" / "rank_program.py"


def rank_program(*extra: str):
    return resume_target.command(["{python}", str(RANK_PROGRAM), "{checkpoint_dir}", *extra],
                                 name="rank_program" + "_".join(extra).replace("-", "_"), steps=8, world_size=2)


@pytest.mark.parametrize("kill", ["ckpt3", "ckpt3+1", "ckpt4:rank1"])
def test_a_command_target_runs_one_program_per_rank(engine, kill):
    from pytest_resume_check.records.kill_ids import parse_kill_id

    result = judge(engine, rank_program(), {}, *parse_kill_id(kill))
    assert result.verdict.findings == []
    ranks = {e.rank for r in result.runs for e in r.events if e.kind == "consumed"}
    assert ranks == {0, 1}


def test_a_rank_of_a_command_target_that_repeats_inputs_is_named(engine):
    result = judge(engine, rank_program("--bug", "own-order"), {}, KillSpec(3))
    assert result.verdict.categories == [vd.LOST, vd.DUPLICATED]
    assert result.verdict.findings[1].headline.startswith("DUPLICATED 3 inputs on rank 1 after resume from "
                                                          "ckpt_3_rank0.json")


@pytest.mark.parametrize("mode, words", [
    ("deep", "RecursionError"),
    ("huge_number", "OverflowError"),
    ("kill_ready", "'kill_ready' is the client's own call in crash cells"),
    ("watched", "'watched' is the watcher's own call for a program declared with checkpoints="),
])
def test_lines_that_are_no_call_of_a_program_are_protocol_violations(engine, mode, words):
    result = judge(engine, program(mode), {}, KillSpec(1))
    assert result.verdict.categories == [vd.PROTOCOL], result.verdict.headline
    assert "which is not a call of the protocol" in result.verdict.headline and words in result.verdict.headline
    assert "answer: {'ok': False" in Path(result.reference.plan.log_path).read_text()


def test_a_program_is_done_when_it_exits_whatever_a_process_it_forked_holds(engine, tmp_path):
    target = program("helper")
    record = engine.run(engine.plan(target, {}, tmp_path, 0), target)
    assert record.outcome == "done", record.describe()  # not HUNG: the helper sleeps 120 s, the limit is 30 s


def test_a_program_that_logs_for_longer_than_the_hang_limit_is_alive(tmp_path):
    engine = Engine(tmp_path / "session", seed=7, hang_timeout=2)
    target = program("long_log", steps=1)
    record = engine.run(engine.plan(target, {}, tmp_path, 0), target)
    assert record.outcome == "done", record.describe()
    assert sum(e.kind == "log" for e in record.events) > 100


def test_a_program_that_never_reports_hangs_with_advice_for_programs(tmp_path):
    engine = Engine(tmp_path / "session", seed=7, hang_timeout=1)
    result = judge(engine, program("mute"), {}, KillSpec(1))
    assert result.verdict.categories == [vd.HUNG]
    assert "the program (" in result.verdict.headline and "client.connect()" in result.verdict.headline
    assert "spawn" not in result.verdict.headline


def test_a_line_longer_than_the_harness_reads_is_one_violation_and_the_next_call_is_answered(engine):
    result = judge(engine, program("long_line"), {}, KillSpec(1))
    assert result.verdict.categories == [vd.PROTOCOL]
    assert "sent a line longer than 16777216 bytes" in result.verdict.headline
    assert sum(e.kind == "protocol" for e in result.reference.events) == 1
    log = Path(result.reference.plan.log_path).read_text()
    assert "answer: {'ok': False" in log and "answer: {'ok': True, 'value': None}" in log


FACTS = Path(__file__).resolve().parents[1] / "support" / "interpreter_facts.py"


@pytest.mark.parametrize("code", [0, 3])
def test_a_script_run_in_the_runs_process_sees_what_a_fresh_interpreter_gives_it(engine, tmp_path, code):
    """``{python} script.py`` of a client program runs in the run's process, forked from the preloaded
    server; its arguments, __main__, __file__, working folder, sys.path[0], environment, exit functions and exit
    code are those of the same script started as a process of its own (fresh_interpreter=True)."""
    from pytest_resume_check.child.command import python_program
    from pytest_resume_check.process.layout import Layout

    seen = {}
    for fresh in (False, True):
        target = resume_target.command(["{python}", FACTS.name, str(code), "--out", "{checkpoint_dir}"],
                                       name=f"facts_{code}_{'fresh' if fresh else 'forked'}", steps=1,
                                       cwd=FACTS.parent, env={"FACTS_VALUE": "x"}, fresh_interpreter=fresh)
        assert (python_program(target.command) is None) is fresh
        plan = engine.runner.plan(target, {}, Layout(tmp_path).fresh(tmp_path / target.name), 0)
        record = engine.runner.run(plan, target)
        out = Path(plan.checkpoint_dir)
        facts = json.loads((out / "facts.json").read_text())
        assert facts["argv"][2] == str(out)
        facts["argv"][2] = "OUT"  # each run's own folder
        seen[fresh] = (record.outcome, (out / "exit_functions_ran").exists() and (out / "thread_finished").exists(),
                       record.error.splitlines()[-1].split(" exited ")[-1] if record.error else None, facts)
    assert seen[False] == seen[True]
    outcome, ran, exited, facts = seen[False]
    assert ran  # the exit function the script registered ran, and the thread it started finished
    assert exited == (f"with code {code}" if code else None) and outcome == ("raised" if code else "done")
    assert facts == {"argv": [str(code), "--out", "OUT"], "argv0": FACTS.name, "name": "__main__",
                     "file": FACTS.name, "cwd": str(FACTS.parent), "path0": str(FACTS.parent), "env": "x",
                     "connected": True}
