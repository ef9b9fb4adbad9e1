"""Zero-change programs that commit each checkpoint through a pointer or tracker file (DeepSpeed's ``latest``,
Megatron-LM's and verl's ``latest_checkpointed_iteration.txt``): their checkpoints are published when the pointer
names them, declared (``commit="latest.txt"``) or recognised in the uninterrupted run, so every kill comes before or
after that commit, never between a checkpoint and its pointer.

The program is tests/support/pointer_program.py (stdlib only). Judged cell by cell over the default quick matrix
with its crash smoke cells: the correct program passes every cell; writing the pointer before its checkpoint fails
every cell whose resume it breaks, the headline naming that cause; a scheduler left out of the checkpoint changes
the delivered model; reading the pointer and then starting over is a fresh start, never a resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_resume_check.cells.matrix import QUICK, Cell, cells
from pytest_resume_check.engine import Engine, FilledInPlace
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.judge.state_verdict import MSG_OUTPUT_MISSING
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.faults import MODE_POWER
from pytest_resume_check.report.summary import MSG_COMMIT_RECOGNISED
from pytest_resume_check.report.text import MSG_COMMIT_DECLARED, cell_json, failure_text
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "pointer_program.py"
STEPS = 6  # checkpoints an uninterrupted run commits (12 training steps, one checkpoint every second)
POINTER = "latest.txt"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("zero_change_commit"), seed=3, hang_timeout=60)


def program(*flags: str, name: str, checkpoints: str = "ckpt_*.json", **options):
    return resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}", *flags], name=name, steps=STEPS,
                                 checkpoints=checkpoints, outputs=["model.json"], **options)


def matrix(engine, target):
    """Every cell of the default quick matrix with its crash smoke cells, judged: {kill id: result}."""
    every = cells(target, QUICK, 1) + engine.crash_cells(target, QUICK)
    engine.register(every)
    return {cell.kill_id: engine.run_cell(cell) for cell in every}


def judge(engine, target, *kills):
    return engine.run_cell(Cell(target, {}, "auto", tuple(kills), STEPS))


def completes_save(result) -> bool:
    """A crash cell whose fault comes after the save's last operation (its commit)."""
    fault = result.cell.kills[0].fault
    return fault is not None and fault.completes_save


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "recognised"])
def test_a_program_committing_through_a_pointer_passes_every_cell(engine, declared):
    options = {"commit": POINTER} if declared else {}
    results = matrix(engine, program(name=f"pointer_{'declared' if declared else 'recognised'}", **options))
    assert len(results) == 10 and sum(completes_save(r) for r in results.values()) == 1
    failing = {kill: r.verdict.headline for kill, r in results.items() if not r.passed}
    assert not failing
    killed = results["ckpt3"]
    assert killed.reference.plan.commit == POINTER  # recognised in the reference, or declared
    commits = [e for e in killed.runs[0].events if e.kind == ev.COMMIT]
    assert [(e.step, Path(e.path).name, e.extra[ev.EXTRA_FILE], e.extra[ev.EXTRA_COMPLETE]) for e in commits] == [
        (n, f"ckpt_{2 * n}.json", POINTER, True) for n in (1, 2, 3)]
    assert killed.runs[1].resumed_step == 3 and killed.runs[1].resumed_path.endswith("ckpt_6.json")


def test_a_pointer_written_before_its_checkpoint_fails_every_resume_it_breaks_naming_the_cause(engine):
    results = matrix(engine, program("--order", "pointer-first", name="pointer_first"))
    for kill, result in results.items():
        breaks = result.cell.kills[0].fault is None or completes_save(result)  # the kill came right after a commit
        assert result.passed is not breaks, (kill, result.verdict.headline)
        if breaks:
            step = result.cell.kills[0].checkpoint_step
            assert result.verdict.categories[0] == vd.RESUME_ERROR
            assert result.verdict.headline.startswith("RESUME_ERROR: " + vd.MSG_COMMITTED_EARLY.format(
                file=POINTER, checkpoint=f"ckpt_{2 * step}.json") + "; run 2 raised while resuming"), kill
    failing = results["ckpt2"]  # its report says which file was taken for the commit point, and how to declare it
    assert cell_json(failing)["commit"] == {"file": POINTER, "recognised": True}
    line = MSG_COMMIT_RECOGNISED.format(target="pointer_first", file=POINTER)
    assert "  " + line in failure_text(failing).splitlines()


def test_a_scheduler_left_out_of_the_checkpoint_changes_the_delivered_model(engine):
    results = matrix(engine, program("--unsaved-scheduler", name="unsaved_scheduler"))
    # The scheduler has decayed once by step 4 (checkpoint 2) and not at all by step 2; a resume at step 12 trains
    # nothing more.
    passing = {"ckpt1", "ckpt6"} | {k for k, r in results.items() if r.cell.kills[0].fault and not completes_save(r)}
    assert {k for k, r in results.items() if r.passed} == passing
    for kill, result in results.items():
        if kill not in passing:
            assert result.verdict.categories == [vd.STATE_DIVERGED], kill
            assert result.verdict.headline.endswith("): model.json differs"), kill


def test_reading_the_pointer_and_then_starting_over_is_a_fresh_start(engine):
    result = judge(engine, program("--start-over", name="start_over", commit=POINTER), KillSpec(3))
    assert result.verdict.categories[0] == vd.STALE_RESUME
    assert "run 2 started fresh (resumed step 0) but ckpt_6.json (checkpoint 3) was published" in \
        result.verdict.headline
    assert result.runs[1].resumed_path is None  # the pointer it read restored nothing
    assert "  " + MSG_COMMIT_DECLARED.format(file=POINTER) in failure_text(result).splitlines()


@pytest.mark.parametrize("names", ["name", "path", "number"])
def test_the_checkpoint_a_pointer_names_by_name_path_or_step_number_is_the_one_published(engine, names):
    result = judge(engine, program("--names", names, name=f"pointer_{names}", commit=POINTER), KillSpec(4))
    assert result.passed, result.verdict.headline
    assert [Path(path).name for _, path in result.runs[0].published] == [f"ckpt_{2 * n}.json" for n in range(1, 5)]
    assert result.runs[1].resumed_step == 4


def test_a_count_that_does_not_fit_says_how_many_the_reference_committed(engine):
    target = resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}"], name="misfit_commits", steps=8,
                                   checkpoints="ckpt_*.json", commit=POINTER)
    result = engine.run_cell(Cell(target, {}, "auto", (KillSpec(2),), 8))
    assert result.verdict.headline == vd.MSG_COMMITS.format(declared=8, actual=STEPS, commit=POINTER)


def test_checkpoint_folders_filled_in_place_are_committed_by_their_tracker(engine):
    """verl's layout: a folder per checkpoint filled in place, then a tracker holding the step number."""
    target = program("--folders", "--names", "number", name="tracked_folders", checkpoints="ckpt_*")
    for kills in [(KillSpec(2),), (KillSpec(5),), (KillSpec(1), KillSpec(5))]:
        result = judge(engine, target, *kills)
        assert result.passed, result.verdict.headline
        assert result.reference.plan.commit == POINTER
        assert result.runs[-1].resumed_path.endswith(f"ckpt_{2 * kills[-1].checkpoint_step}")


def test_a_tracker_written_in_place_without_its_bytes_on_disk_breaks_the_resume(engine):
    """The tracker written in place: a power loss before its fsync leaves it empty, and the resume fails (verl's
    ``int("")``)."""
    results = [engine.run_cell(c) for c in engine.crash_cells(
        program("--folders", "--names", "number", name="tracker_in_place", checkpoints="ckpt_*"), QUICK)]
    failing = [r for r in results if not r.passed]
    assert len(failing) == 1 and failing[0].cell.kills[0].fault.mode == MODE_POWER
    assert failing[0].verdict.categories == [vd.RESUME_ERROR]
    assert "not durable: latest.txt (cut to its 0 fsynced bytes)" in failing[0].runs[0].describe()


def test_folders_filled_in_place_without_a_pointer_are_told_to_publish_by_rename(engine):
    target = program("--folders", "--no-pointer", name="filled_in_place", checkpoints="ckpt_*")
    with pytest.raises(FilledInPlace) as raised:
        engine.crash_cells(target, QUICK)
    fix = vd.FIX_FILLED_IN_PLACE.format(folder="ckpt_2")
    assert str(raised.value).endswith(fix) and "crash_save=False" not in str(raised.value)
    result = judge(engine, target, KillSpec(2))
    assert result.verdict.headline == vd.MSG_CHECKPOINTS.format(declared=STEPS, actual=0, glob="ckpt_*") + "; " + fix


def test_an_output_missing_after_the_resume_says_so_and_where(engine):
    result = judge(engine, program("--no-pointer", "--no-model-on-resume", name="no_model_on_resume"), KillSpec(3))
    assert result.verdict.categories == [vd.STATE_DIVERGED]
    where = Path(result.runs[1].plan.checkpoint_dir) / "model.json"
    assert result.verdict.headline == ("STATE_DIVERGED in the final outputs (after resume from ckpt_6.json "
                                       "(checkpoint 3)): " + MSG_OUTPUT_MISSING.format(name="model.json", where=where))


def test_an_output_the_uninterrupted_run_never_delivers_is_a_protocol_finding(engine):
    target = resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}", "--no-pointer"], name="wrong_output",
                                   steps=STEPS, checkpoints="ckpt_*.json", outputs=["model.pt"])
    result = judge(engine, target, KillSpec(3))
    assert result.verdict.headline.startswith("PROTOCOL: the reference run delivered nothing matching "
                                              "outputs='model.pt' (expected at ")


RECIPE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "recipes" / "pointer"


def test_recipe_project_passes_and_the_pointer_is_recognised_without_its_declaration(pytester):
    """The recipe's torch script as a user runs it: every cell of the default matrix passes with ``commit=``
    declared and without it (the summary names the file recognised); its pointer written first fails every kill,
    the headline naming the cause."""
    pytest.importorskip("torch")
    for name in ("conftest.py", "train.py", "pytest.ini"):
        (pytester.path / name).write_text((RECIPE / name).read_text())
    args = ("--resume-matrix", "-p", "no:cacheprovider", "-k", "auto-ckpt2 or auto-ckpt5 or save2")
    result = pytester.runpytest_subprocess(*args, timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*resume matrix: 5 cells, 0 failing, 0 expected failures, seed *"])
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text().replace(' commit="latest.txt",', ""))
    result = pytester.runpytest_subprocess(*args, timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["pointer_script: latest.txt recognised as the commit point of its checkpoints *; "
                                 "declare commit='latest.txt' to say so"])
    conftest.write_text(conftest.read_text().replace('"{seed}"]', '"{seed}", "--order", "pointer-first"]'))
    result = pytester.runpytest_subprocess("--resume-matrix", "-p", "no:cacheprovider", "-k", "auto-ckpt2",
                                           timeout=600)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*pointer_script[[]default-auto-ckpt2[]]: RESUME_ERROR: latest.txt named ckpt_4.pt "
                                 "before it was complete, and the kill came between the two *"])
