"""Zero-change command targets: a program with no client calls, declared with where its
checkpoints appear and what it delivers, is killed at its checkpoint publications, and judged on the checkpoint
each resume opened, crash consistency and its final outputs.

The program (tests/support/zero_change_program.py, stdlib only) passes every kind of cell; each planted bug
fails for its own reason: checkpoints picked by sorted name (STALE_RESUME naming both checkpoints), never
resuming (STALE_RESUME, started fresh), a save written in place (the crash smoke cells), momentum left out of the
checkpoint (STATE_DIVERGED in the final outputs, naming the file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_resume_check.cells.matrix import QUICK, Cell, cells
from pytest_resume_check.child import watch
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "zero_change_program.py"
STEPS = 6  # checkpoints an uninterrupted run publishes (12 training steps, one checkpoint every second)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("zero_change"), seed=3, hang_timeout=60)


def program(*flags: str, name: str = "unchanged", **options):
    return resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}", *flags], name=name, steps=STEPS,
                                 checkpoints="step_*.json", outputs=["model.json"], **options)


def judge(engine, target, *kills, mode="auto"):
    return engine.run_cell(Cell(target, {}, mode, tuple(kills), STEPS))


@pytest.mark.parametrize("kills", [(KillSpec(1),), (KillSpec(3),), (KillSpec(6),), (KillSpec(1), KillSpec(5))],
                         ids=["ckpt1", "ckpt3", "ckpt6", "ckpt1_ckpt5"])
def test_a_correct_program_passes_kills_at_its_checkpoints(engine, kills):
    result = judge(engine, program(), *kills)
    assert result.passed, result.verdict.headline
    assert len(result.runs) == len(kills) + 1  # really killed and resumed
    last_kill = kills[-1].checkpoint_step
    assert result.runs[-1].resumed_step == last_kill  # seen from the checkpoint it opened
    assert result.runs[-1].resumed_path.endswith(f"step_{2 * last_kill}.json")
    published = [step for step, _ in result.runs[0].published]
    assert published == list(range(1, kills[0].checkpoint_step + 1))  # every save is a publication, in order


def test_the_checkpoint_passed_by_path_is_the_one_restored(engine):
    target = program("--from", "{resume_path}", name="by_path")
    assert target.resume_modes == ("auto", "path")
    result = judge(engine, target, KillSpec(3), mode="path")
    assert result.passed, result.verdict.headline
    assert result.runs[1].resumed_step == 3


def test_a_program_without_resume_path_is_resumed_automatically_only():
    assert program().resume_modes == ("auto",)
    assert program().contract.ledgers == ()
    kinds = {(cell.resume_mode, tuple(k.extra_steps for k in cell.kills)) for cell in cells(program(), QUICK, 1)}
    assert kinds == {("auto", (0,)), ("auto", (0, 0))}  # kills land at checkpoints only


def test_checkpoints_picked_by_sorted_name_are_a_stale_resume(engine):
    result = judge(engine, program("--pick", "name", name="by_name"), KillSpec(5))
    assert result.verdict.categories == [vd.STALE_RESUME]
    assert result.verdict.headline == (
        "STALE_RESUME: run 2 resumed from step_8.json (checkpoint 4) but step_10.json (checkpoint 5) was published "
        "before the kill: 1 checkpoint of training lost")
    assert judge(engine, program("--pick", "name", name="by_name"), KillSpec(4)).passed  # step_8 is the newest


def test_a_program_that_never_resumes_started_fresh(engine):
    result = judge(engine, program("--pick", "none", name="never_resumes"), KillSpec(3))
    assert result.verdict.categories[0] == vd.STALE_RESUME
    assert "started fresh (resumed step 0)" in result.verdict.headline


def test_state_left_out_of_the_checkpoint_changes_the_final_outputs(engine):
    result = judge(engine, program("--unsaved-momentum", name="unsaved_momentum"), KillSpec(3))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    assert result.verdict.headline.startswith("STATE_DIVERGED in the final outputs")
    assert "model.json differs" in result.verdict.headline


def test_a_save_written_in_place_fails_the_crash_smoke_cells(engine):
    atomic = engine.crash_cells(program(name="atomic_save"), QUICK)
    assert atomic and all(engine.run_cell(cell).passed for cell in atomic)
    in_place = engine.crash_cells(program("--save", "in-place", name="in_place_save"), QUICK)
    results = [engine.run_cell(cell) for cell in in_place]
    failing = [r for r in results if not r.passed]
    assert failing, [r.cell.kill_id for r in results]
    assert {r.verdict.categories[0] for r in failing} == {vd.RESUME_ERROR}
    assert all("JSONDecodeError" in r.runs[1].error for r in failing)  # the program could not read its torn file


def test_the_index_numbers_each_checkpoint_by_publication(engine):
    result = judge(engine, program(name="indexed"), KillSpec(2))
    folder = Path(result.runs[0].plan.checkpoint_dir)
    index = json.loads((folder / watch.INDEX).read_text())
    assert index == {"version": watch.INDEX_VERSION,
                     "checkpoints": {f"step_{2 * n}.json": n for n in range(1, STEPS + 1)}}


def test_a_program_the_watcher_cannot_reach_says_why(engine):
    target = resume_target.command(["sh", "-c", "mkdir -p {checkpoint_dir} && echo 1 > {checkpoint_dir}/step_2.json"],
                                   name="shell_program", steps=1, checkpoints="step_*.json")
    result = judge(engine, target, KillSpec(1))
    assert "nothing watched its checkpoints" in result.verdict.headline
    assert "{python}" in result.verdict.headline


def test_a_sitecustomize_of_the_project_still_runs(engine, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], 'site_ran'), 'w').close() if len(sys.argv) > 1 else None\n")
    target = program(name="own_site", env={"PYTHONPATH": str(tmp_path)})
    result = judge(engine, target, KillSpec(2))
    assert result.passed, result.verdict.headline
    assert (Path(result.runs[0].plan.checkpoint_dir) / "site_ran").exists()


def test_outside_the_harness_the_program_runs_as_always(tmp_path):
    import subprocess

    env = {"PYTHONPATH": str(Path(watch.__file__).parent / "startup")}
    subprocess.run([sys.executable, str(PROGRAM), str(tmp_path)], check=True, env=env, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"] + sorted(
        f"step_{2 * n}.json" for n in range(1, STEPS + 1))  # no index: nothing watched it


@pytest.mark.parametrize(("glob", "steps", "published"), [("ckpt_*.json", STEPS, 0), ("step_*.json", 8, STEPS)])
def test_a_glob_or_count_that_does_not_fit_says_what_the_reference_published(engine, glob, steps, published):
    target = resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}"], name=f"misfit_{steps}",
                                   steps=steps, checkpoints=glob)
    result = engine.run_cell(Cell(target, {}, "auto", (KillSpec(2),), steps))
    assert result.verdict.headline == vd.MSG_CHECKPOINTS.format(declared=steps, actual=published, glob=glob)


RECIPE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "recipes" / "zero_change"


def test_recipe_project_passes_and_a_planted_name_sort_is_caught(pytester):
    """The recipe's torch script, unchanged, as a user runs it: a kill at a checkpoint and the crash smoke
    cells of its atomic save pass (torch.save and torch.load seen by the watcher); picked by sorted name,
    the resume after checkpoint 5 (step_10.pt) takes step_8.pt."""
    pytest.importorskip("torch")
    for name in ("conftest.py", "train.py", "pytest.ini"):
        (pytester.path / name).write_text((RECIPE / name).read_text())
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-k", "auto-ckpt5 or power",
                                           timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*resume matrix: 3 cells, 0 failing, 0 expected failures, seed *",
                                 "unchanged_script: 2 crash-consistency cells of the save of checkpoint 2 *"])
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text().replace('"{seed}"]', '"{seed}", "--pick", "name"]'))
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-k", "auto-ckpt5",
                                           timeout=600)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*unchanged_script[[]default-auto-ckpt5[]]: STALE_RESUME: run 2 resumed from "
                                 "step_8.pt (checkpoint 4) but step_10.pt (checkpoint 5) was published before the "
                                 "kill: 1 checkpoint of training lost"])
