"""Where a hung run hung: before the harness kills a hung run, each process that runs the target
writes every thread's Python stack into the run's log, and the cell's report quotes the innermost frames.

Each hang is planted (a trainer that blocks forever in ``wait_forever_in_my_loop``) with a small hang limit;
no assertion depends on how long anything takes. No torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import misbehaving_target as misbehaving
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records import kill_ids
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.report import text as rp
from pytest_resume_check.targets import resume_target

HANG_LIMIT = 3
ONE = resume_target(misbehaving.train, name="hangs", steps=misbehaving.STEPS, hang_timeout=HANG_LIMIT)
RANKS = resume_target(misbehaving.train_ranks, name="hangs_on_rank1", steps=misbehaving.STEPS, world_size=2,
                      hang_timeout=HANG_LIMIT)
PLANTED = "wait_forever_in_my_loop"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("hung"), seed=1, hang_timeout=30)
    yield eng
    eng.close()


def run_cell(engine, target, case, kill_id):
    return engine.run_cell(Cell(target, case, "auto", kill_ids.parse_kill_id(kill_id), misbehaving.STEPS))


def stacks_section(report):
    """The lines under the report's "where run N hung" title, up to the next section."""
    lines = report.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  where "))
    section = []
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        section.append(line.strip())
    return lines[at], section


def assert_nothing_left(rec):
    """The run's process group and every process that wrote stacks are gone."""
    assert rec.leftovers == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(rec.pid, 0)
    for proc in rp.stacks(rec.plan.log_path):
        with pytest.raises(ProcessLookupError):
            os.kill(proc["pid"], 0)


def test_a_hung_runs_report_names_the_function_it_hung_in(engine):
    result = run_cell(engine, ONE, {"hang": True}, "ckpt2")
    assert result.verdict.categories == [vd.HUNG]
    hung = result.runs[1]
    assert hung.outcome == Outcome.HUNG and hung.hang_timeout == HANG_LIMIT
    # The headline names the file that holds the stacks (the run's log, kept with the cell).
    assert hung.stack_dumps == [(None, True)]
    assert result.verdict.headline.endswith(vd.MSG_HUNG_STACK.format(path=hung.plan.log_path))
    report = rp.failure_text(result)
    title, section = stacks_section(report)
    assert title == rp.STACKS_TITLE.format(run="run 2", path=hung.plan.log_path)
    assert section[0] == f"pid {hung.pid}, main thread:"
    frames = section[1:]
    assert len(frames) == rp.STACK_FRAMES
    assert [f.rpartition(" in ")[2] for f in frames[2:5]] == [PLANTED, "train", "drive"]
    assert "misbehaving_target.py" in frames[2]
    # The harness's own thread (its event writer) is not quoted, and the output lines stop before the stacks.
    assert "_write_loop" not in report
    assert not any(rp.STACKS_HEADER_PATTERN.match(line.strip()) for line in report.splitlines())
    # The JSON carries the stacks, and its log tail is the run's output only.
    run = rp.cell_json(result)["runs"][1]
    (proc,) = run["stacks"]
    assert proc["rank"] is None and proc["pid"] == hung.pid
    main = proc["threads"][-1]
    assert main["main"] and [f["function"] for f in main["frames"]][2:4] == [PLANTED, "train"]
    assert not any("Thread 0x" in line or "File " in line for line in run["log_tail"])
    assert_nothing_left(hung)


def test_a_thread_that_hangs_is_quoted_beside_the_main_thread_that_waits_for_it(engine):
    result = run_cell(engine, ONE, {"hang_thread": True}, "ckpt2")
    assert result.verdict.categories == [vd.HUNG]
    hung = result.runs[1]
    _, section = stacks_section(rp.failure_text(result))
    heads = [line for line in section if not line.startswith("File ")]
    assert heads[0] == f"pid {hung.pid}, main thread:"
    assert len(heads) == 2 and heads[1].startswith(f"pid {hung.pid}, thread 0x")
    main = section[1:section.index(heads[1])]
    assert any(line.endswith("in join") for line in main) and any(line.endswith("in train") for line in main)
    worker = section[section.index(heads[1]) + 1:]
    assert any(line.endswith(f"in {PLANTED}") for line in worker)
    assert_nothing_left(hung)


def test_a_rank_that_never_reaches_the_kill_point_is_quoted_with_rank_0_waiting_there(engine):
    """Rank 1 of the resumed run blocks in step 3; rank 0 waits at the kill point after step 3 until the hang
    limit (the supervisor's wait for its peers). Both ranks' stacks are in the report, each marked."""
    result = run_cell(engine, RANKS, {"hang": True}, "ckpt1_ckpt3")
    assert result.verdict.categories == [vd.HUNG]
    assert "rank 1 did not report the end of step 3" in result.verdict.headline
    hung = result.runs[1]
    assert hung.stack_dumps == [(0, True), (1, True)]
    assert result.verdict.headline.endswith(vd.MSG_HUNG_STACKS.format(path=hung.plan.log_path))
    _, section = stacks_section(rp.failure_text(result))
    processes = rp.stacks(hung.plan.log_path)
    assert [p["rank"] for p in processes] == [0, 1]
    rank0, rank1 = (f"rank {p['rank']} (pid {p['pid']}), main thread:" for p in processes)
    assert rank0 in section and rank1 in section
    zero = section[section.index(rank0) + 1:section.index(rank1)]
    one = section[section.index(rank1) + 1:]
    assert any(line.endswith("in _await_kill") for line in zero) and not any(PLANTED in line for line in zero)
    assert any(line.endswith(f"in {PLANTED}") for line in one)
    assert any(line.endswith("in train_ranks") for line in one)
    assert_nothing_left(hung)


def test_a_rank_that_finished_is_left_alone_and_the_one_that_hangs_is_quoted(engine):
    """Rank 0 of the resumed run trains to its end and exits; rank 1 blocks. Only rank 1 is asked for its
    stacks: rank 0's pid is no process of the run any more (it may be another process's by then)."""
    result = run_cell(engine, RANKS, {"hang": True}, "ckpt2")
    assert result.verdict.categories == [vd.HUNG]
    hung = result.runs[1]
    assert [p["rank"] for p in rp.stacks(hung.plan.log_path)] == [1]
    assert hung.stack_dumps == [(0, False), (1, True)]
    assert result.verdict.headline.endswith(vd.MSG_HUNG_STACKS_OF.format(ranks="rank 1", path=hung.plan.log_path))
    _, section = stacks_section(rp.failure_text(result))
    assert section[0].startswith("rank 1 (pid ") and any(line.endswith(f"in {PLANTED}") for line in section)
    assert_nothing_left(hung)


def test_a_hung_reference_run_is_quoted_too(engine):
    result = run_cell(engine, ONE, {"hang_always": True}, "ckpt2")
    assert result.verdict.categories == [vd.HUNG] and result.runs == []
    title, section = stacks_section(rp.failure_text(result))
    assert title == rp.STACKS_TITLE.format(run="the reference run", path=result.reference.plan.log_path)
    assert result.verdict.headline.endswith(vd.MSG_HUNG_STACK.format(path=result.reference.plan.log_path))
    assert section[0] == f"pid {result.reference.pid}, main thread:"
    assert any(line.endswith(f"in {PLANTED}") for line in section)
    assert_nothing_left(result.reference)


def test_a_run_that_does_not_hang_writes_no_stacks(engine):
    result = run_cell(engine, ONE, {}, "ckpt2")
    assert result.verdict.passed
    for rec in result.runs:
        assert rp.stacks(rec.plan.log_path) == [] and rec.stack_dumps == []
        assert "stacks" not in rp.cell_json(result)["runs"][0]


def test_a_spawned_run_that_hangs_names_the_function_too(tmp_path):
    """A fresh interpreter per run installs the handler as a forked child does. Its limit is larger: a spawned
    interpreter's start-up counts against it, and this run must not hang before it starts the trainer."""
    target = ONE.with_options(name="hangs_spawned", isolation="spawn", hang_timeout=10)
    engine = Engine(tmp_path, seed=1, hang_timeout=30, check_determinism=False)
    try:
        result = run_cell(engine, target, {"hang": True}, "ckpt2")
    finally:
        engine.close()
    assert result.verdict.categories == [vd.HUNG]
    _, section = stacks_section(rp.failure_text(result))
    assert any(line.endswith(f"in {PLANTED}") for line in section)
    assert_nothing_left(result.runs[1])


PAGE = Path(__file__).resolve().parents[2] / "docs" / "reading-a-report.md"


def shape(line):
    """A report line without what differs between machines and runs: pids, paths, line numbers."""
    line = re.sub(r'File ".*", line \d+ in ', "in ", line)
    line = re.sub(r"pid \d+", "pid N", line)
    line = re.sub(r"stack is in \S+$", "stack is in PATH", line)  # the headline's end
    return re.sub(r"is in \S+\):$", "is in PATH):", line)


def test_the_report_page_shows_a_hung_report_as_the_harness_prints_it(engine):
    """docs/reading-a-report.md's example of a hung two-rank run (its paths, pids and line numbers are
    illustrative; the lines, the functions and their order are this run's)."""
    text = PAGE.read_text()
    block = re.search(r"^```console\n(HUNG: .*?)^```", text, re.M | re.S)[1].splitlines()
    result = run_cell(engine, RANKS, {"hang": True}, "ckpt1_ckpt3")
    report = rp.failure_text(result).splitlines()
    at = next(i for i, line in enumerate(block) if line.startswith("  where run "))
    assert [shape(line) for line in block[:at]] == [shape(line) for line in report[:at]]
    assert report[0].endswith(vd.MSG_HUNG_STACKS.format(path=result.runs[1].plan.log_path))
    _, section = stacks_section("\n".join(report))
    assert [shape(line) for line in block[at:]] == [shape(line) for line in report[at:at + 1 + len(section)]]
    header = re.search(r"`(\[resume-check\] stacks of [^`]*)`", text.replace("\n", " "))[1]
    assert rp.STACKS_HEADER_PATTERN.match(header)
