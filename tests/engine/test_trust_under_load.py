"""A verdict to trust on a loaded machine: correct trainers that do ordinary things - save in a
SIGTERM handler, run two ranks, write in a background thread, take long steps that keep reporting - pass
whatever the timing; races of the harness itself are made impossible, not unlikely.

Real processes, real signals, real gloo for the two-rank loop; torch-free otherwise.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trust_targets as tt

from pytest_resume_check.cells import matrix
from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.records import kill_ids
from pytest_resume_check.records.results import Outcome
from pytest_resume_check.targets import resume_target


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("trust"), seed=3, hang_timeout=60)
    yield eng
    eng.close()


def judge(engine, target, kill_id, case=None):
    case = case if case is not None else target.cases[0]
    cell = Cell(target, case, "auto", kill_ids.parse_kill_id(kill_id), int(target.steps(case)))
    return engine.run_cell(cell)


term_saver = resume_target(steps=tt.STEPS, preemption=[2.0], name="term_saver")(tt.term_saver)
churning_saver = resume_target(steps=tt.STEPS, name="churning_saver")(tt.churning_saver)
long_step_logger = resume_target(steps=2, hang_timeout=3, name="long_step_logger")(tt.long_step_logger)


#: A sink over a real pipe whose write raises SIGUSR1 in its own process right after the kill-ready event
#: is written: the handler (which reports too) runs while that report call is still in progress, the
#: moment that deadlocked a SIGTERM handler that saves (the call held the sink's lock).
SIGNAL_INSIDE_A_REPORT = textwrap.dedent("""
    import os, signal, multiprocessing
    from pytest_resume_check.records import events as ev
    from pytest_resume_check.child.main import ConnectionSink

    reader, writer = multiprocessing.Pipe(duplex=False)

    class Signalling:
        def send_bytes(self, raw):
            writer.send_bytes(raw)
            if b"kill_ready" in raw:
                os.kill(os.getpid(), signal.SIGUSR1)

    sink = ConnectionSink(Signalling())
    signal.signal(signal.SIGUSR1, lambda *a: sink.send(ev.Event(ev.CHECKPOINT, step=3, path="/ckpt/step_3")))
    sink.send(ev.Event(ev.CONSUMED, step=3, epoch=0, ids=(5,)))
    sink.send(ev.Event(ev.KILL_READY, text="here"))
    sink.send(ev.Event(ev.STEP_END, step=3))
    kinds = []
    while reader.poll(0.5):
        kinds += [ev.Event.from_wire(line).kind for line in reader.recv_bytes().split(b"\\n")]
    print(",".join(kinds))
""")


def test_a_signal_handler_that_reports_inside_a_report_call_does_not_deadlock():
    # 30 s: a deadlock never ends; the script takes well under a second.
    out = subprocess.run([sys.executable, "-c", SIGNAL_INSIDE_A_REPORT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "consumed,kill_ready,checkpoint,step_end"


def test_a_sigterm_handler_that_saves_publishes_and_exits_passes_every_time(engine):
    for attempt in range(20):
        result = judge(engine, term_saver, "ckpt2+1:term2")
        assert result.verdict.findings == [], f"attempt {attempt}: {result.verdict.headline}"
        first = result.runs[0]
        assert first.published[-1][0] == 3  # its handler saved the step it was in
        assert result.runs[1].resumed_step == 3


def test_a_helper_the_trainer_forks_reports_on_the_same_channel_without_garbling_it(engine):
    forking = resume_target(steps=tt.STEPS, name="forking_logger")(tt.forking_logger)
    result = judge(engine, forking, "ckpt3")
    assert result.verdict.findings == [], result.verdict.headline
    logs = [e.text for e in result.reference.events if e.kind == "log"]
    assert any(t.startswith("helper") for t in logs) and any(t.startswith("trainer") for t in logs)


def test_a_snapshot_is_taken_while_every_process_of_the_run_is_stopped(engine):
    """The shared first run's copy of its checkpoint folder: a thread of the trainer keeps renaming and
    deleting files there, which made the copy fail with a raw shutil.Error; stopped, it cannot."""
    cells = [c for c in matrix.cells(churning_saver, "quick", 3) if c.shares_prefix]
    assert len(cells) >= 3
    engine.register(cells)
    for cell in cells:
        result = engine.run_cell(cell)
        assert result.verdict.findings == [], f"{cell.id}: {result.verdict.headline}"


def test_a_step_longer_than_the_hang_limit_that_keeps_reporting_is_alive(engine, tmp_path):
    plan = engine.plan(long_step_logger, {}, tmp_path, 0)
    record = engine.run(plan, long_step_logger)
    assert record.outcome == Outcome.DONE, record.error
    assert record.hang_timeout == 3 < tt.LONG_STEP


def test_a_step_that_reports_nothing_for_longer_than_the_hang_limit_still_hangs(engine, tmp_path):
    silent = resume_target(steps=2, hang_timeout=1, name="silent_step")(tt.long_step_logger)
    plan = engine.plan(silent, {"silent": True}, tmp_path, 0)
    record = engine.run(plan, silent)
    assert record.outcome == Outcome.HUNG


two_rank_loop = resume_target(steps=tt.STEPS, world_size=2, cases=[{"slow_rank1": True}], name="two_rank_loop",
                              preload=("torch", "torch.distributed"))(tt.two_rank_loop)


def test_every_rank_reports_the_kill_point_before_all_ranks_are_killed(engine):
    """Rank 1 takes longer than the old fixed wait (2 s) to report the end of the checkpoint's step: its
    inputs of that step were still in its batch when the SIGKILL came, and the cell failed LOST on rank 1."""
    pytest.importorskip("torch")
    result = judge(engine, two_rank_loop, "ckpt2")
    assert result.verdict.findings == [], result.verdict.headline
    first = result.runs[0]
    assert first.signalled.extra["ranks_past"] == [1]
    killed_at = first.events.index(first.signalled)
    assert any(e.rank == 1 and e.kind == "step_end" and e.step == 2 for e in first.events[:killed_at])


def test_a_rank_that_cannot_reach_the_kill_point_is_named_after_the_hang_limit(tmp_path):
    pytest.importorskip("torch")
    engine = Engine(tmp_path, seed=3, hang_timeout=3)
    early = two_rank_loop.with_options(cases=[{"rank0_ends_early": True}])
    result = judge(engine, early, "ckpt1+1")
    assert result.verdict.categories == ["HUNG"]
    assert result.verdict.headline.startswith("HUNG: run 1 of 1: rank 1 did not report the end of step 2 within the "
                                              "hang limit (3 s) while rank 0 waited at the kill point")


def test_two_rank_verdicts_are_the_same_idle_and_beside_cpu_burners(tmp_path):
    """benchmarks/load_verdicts.py, once: the bundled DDP loop and the two-rank loop that once failed under load,
    each matrix idle and beside two CPU burners, every cell's JSON compared (status, categories, headline,
    composite ledger)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    pytest.importorskip("xdist")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "load_verdicts.py"
    done = subprocess.run([sys.executable, str(script), "--runs", "1", "--burners", "2"], capture_output=True,
                          text=True, timeout=1800)  # generous: about two minutes on 2 cores beside the suite
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "differing cells in all: 0" in done.stdout


def test_a_rank_that_resumed_elsewhere_is_not_waited_for():
    """Its steps are not rank 0's (the verdict says STALE_RESUME); waiting for rank 0's step number from it
    could only last the hang limit."""
    from pytest_resume_check.process import supervisor
    from pytest_resume_check.records import events as ev
    from pytest_resume_check.records.plan import RunPlan
    from pytest_resume_check.records.results import RunRecord

    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/nonexistent", "/nonexistent/run.log", world_size=3)
    resumed = [ev.Event(ev.RESUMED, step=4, rank=0), ev.Event(ev.RESUMED, step=1, rank=1),
               ev.Event(ev.RESUMED, step=4, rank=2)]
    assert supervisor._awaited(RunRecord(plan, resumed)) == [2]
    assert supervisor._awaited(RunRecord(plan, [])) == [1, 2]


def test_every_event_kind_that_ends_or_stops_a_run_has_a_handler_of_its_own():
    """The supervisor's event loop dispatches by kind; the kinds that end the reading (done, an
    error, converged, the kill point) or make the harness act (a pause for a snapshot) have their own."""
    from pytest_resume_check.process import supervisor
    from pytest_resume_check.records import events as ev

    assert set(supervisor.HANDLERS) <= ev.KINDS
    assert {ev.DONE, ev.ERROR, ev.CONVERGED, ev.KILL_READY, ev.PAUSED} <= set(supervisor.HANDLERS)
