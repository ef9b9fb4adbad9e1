"""Targets launched by torchrun: each run is torch's own ``torchrun`` entry point (its elastic agent
in the run's process, c10d rendezvous on loopback, its monitoring, restarts and teardown), whose workers run
the target. A worker killed alone is followed by torchrun restarting the group within the run, and that
restart is judged as a resume; a restart that does not reload fails, and only the real launcher shows it.

Real processes, real torchrun, real gloo on loopback, real SIGKILL and SIGTERM.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import distributed_targets as planted  # noqa: E402

from pytest_resume_check.builtin import ddp  # noqa: E402
from pytest_resume_check.builtin.targets import ddp_loop, ddp_torchrun  # noqa: E402
from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.records import kill_ids  # noqa: E402
from pytest_resume_check.report import text as rp  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("torchrun"), seed=5, hang_timeout=60)
    yield eng
    eng.close()


def run(engine, target, kill_id):
    case = target.cases[0]
    return engine.run_cell(Cell(target, case, "auto", kill_ids.parse_kill_id(kill_id), int(target.steps(case))))


def listening(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("kill", ["ckpt4", "ckpt6+1:rank1", "ckpt5+1:term2", "ckpt9:ws1", "ckpt1_ckpt11+1"])
def test_the_two_worker_loop_under_torchrun_passes_each_kind_of_kill(engine, kill):
    result = run(engine, ddp_torchrun, kill)
    assert result.verdict.findings == []
    rows = rp.cell_json(result)["composite"]
    assert {row[4] for row in rows} >= {0, 1}  # both workers took inputs
    for epoch in range(ddp.EPOCHS):
        assert sorted(row[0] for row in rows if row[2] == epoch) == list(range(ddp.N_INPUTS))
    for rec in result.runs:  # nothing of the run is left: no process, no rendezvous port
        assert rec.plan.launcher == "torchrun"
        assert rec.leftovers == 0
        assert not listening(rec.plan.master_port)


def test_a_worker_killed_alone_is_restarted_by_torchrun_and_the_restart_is_judged_as_a_resume(engine):
    result = run(engine, ddp_torchrun, "ckpt6:rank1")
    assert result.verdict.findings == []
    first, restart = result.runs
    # One job: the restart is the same run's process (torchrun's agent), not a second run the harness started.
    assert restart.plan.restart == 1 and first.plan.restart == 0
    assert restart.plan.log_path == first.plan.log_path
    assert first.signalled.extra["rank"] == 1 and first.signalled.extra["restart"] is True
    runs = rp.cell_json(result)["runs"]
    assert [(r["launcher"], r["restart"], r["outcome"]) for r in runs] == [
        ("torchrun", 0, "killed"), ("torchrun", 1, "done")]
    assert runs[1]["resumed_by_rank"] == {"0": 6, "1": 6}  # both workers of the restart reloaded step 6


def test_the_agent_killed_alone_takes_its_workers_with_it_and_the_next_job_resumes(engine):
    """torch gives each worker the parent-death signal SIGINT: the workers end by themselves once their agent
    is gone, and the next run, a new torchrun job, resumes from the checkpoint before the unsaved step."""
    result = run(engine, ddp_torchrun, "ckpt6+1:agent")
    assert result.verdict.findings == []
    first, resumed = result.runs
    assert first.signalled.extra["agent"] == first.pid
    assert first.teardown.startswith("the workers ended") and first.teardown.endswith("after their agent died")
    assert resumed.resumed_step == 6 and resumed.plan.restart == 0


def test_preemption_reaches_the_workers_through_torchruns_agent(engine):
    result = run(engine, ddp_torchrun, "ckpt11+1:term2")  # the last step: nothing after it would save later
    assert result.verdict.findings == []
    first, resumed = result.runs
    assert first.signalled.extra["pids"] == [first.pid]  # the agent, which forwards SIGTERM to its workers
    assert first.published[-1][0] == 12 and resumed.resumed_step == 12


def test_a_restart_that_does_not_reload_fails_and_only_the_real_launcher_shows_it(engine):
    """The planted loop looks for a checkpoint only when the job was started as a resume; torchrun restarts
    its workers with the same arguments, so they train from the start."""
    under_torchrun = ddp_torchrun.with_options(name="ddp_restart_fresh", fn=planted.ddp_restart_fresh)
    result = run(engine, under_torchrun, "ckpt6+1:rank1")
    assert result.verdict.categories == ["STALE_RESUME"]
    assert result.verdict.headline.startswith("STALE_RESUME: run 2 started fresh (resumed step 0) but step_6 was "
                                              "published before the kill")
    assert "torchrun's restart 1" in rp.failure_text(result)
    # The same loop under the harness's own launcher: every resume is a new job, told so, and it passes.
    harness = ddp_loop.with_options(name="ddp_restart_fresh_harness", fn=planted.ddp_restart_fresh)
    assert run(engine, harness, "ckpt6+1:rank1").verdict.findings == []


def test_a_job_that_uses_up_its_restarts_is_reported_with_the_count(engine):
    target = resume_target(planted.rank1_dies_at_step_3, name="dies_every_attempt", steps=6, world_size=2,
                           launcher="torchrun", max_restarts=2, crash_save=False, resume_modes=("auto",))
    result = run(engine, target, "ckpt2")
    assert not result.passed
    reference = result.reference
    assert reference.outcome == "raised"
    assert reference.error.strip().splitlines()[-1] == (
        "torchrun gave up after 2 restart(s) (--max-restarts=2): rank 1 ended with exit code 3")
    # Three attempts of the reference reported (the first and both restarts).
    assert sorted({e.attempt or 0 for e in reference.events if e.kind == "ranks"}) == [0, 1, 2]
    assert "torchrun gave up after 2 restart(s)" in rp.failure_text(result)


@pytest.mark.parametrize("options, message", [
    ({"launcher": "mpirun"}, "launcher='mpirun' is not one of 'harness', 'torchrun'"),
    ({"max_restarts": 1}, "max_restarts=1 must be a whole number from 0 to 10 .*and needs launcher='torchrun'"),
    ({"launcher": "torchrun", "max_restarts": -1}, "max_restarts=-1 must be a whole number from 0 to 10"),
    ({"launcher": "torchrun", "max_restarts": True}, "max_restarts=True must be a whole number"),
])
def test_bad_launcher_options_name_the_fix(options, message):
    from pytest_resume_check.targets import TargetError

    with pytest.raises(TargetError, match=message):
        resume_target(planted.ddp_one_rank, name="bad", steps=4, world_size=2, **options)


def test_the_bundled_torchrun_target_has_restart_and_preemption_cells():
    from pytest_resume_check.cells import matrix

    ids = [c.kill_id for c in matrix.cells(ddp_torchrun, "quick", 0)]
    assert {"ckpt6:rank1", "ckpt6+1:rank1", "ckpt5+1:term2", "ckpt9:ws1", "ckpt6:agent", "ckpt6+1:agent"} <= set(ids)
    assert ddp_torchrun.launcher == "torchrun" and ddp_torchrun.max_restarts == 1


# -- simulated nodes --------------------------------------------------------------------------------------

def on_two_nodes(fn=ddp.correct_ddp, name="ddp_two_nodes"):
    """The DDP loop on two simulated nodes of one worker each, which may go on with one (--nnodes=1:2), as
    docs/distributed.md declares it."""
    return planted.ddp_two_nodes.with_options(name=name, fn=fn)


@pytest.mark.parametrize("kill", ["ckpt6:node1", "ckpt3+1:node1"])
def test_two_nodes_that_lose_one_go_on_with_the_other_and_pass(engine, kill):
    result = run(engine, on_two_nodes(), kill)
    assert result.verdict.findings == []
    first, restart = result.runs
    assert (first.plan.world_size, restart.plan.world_size) == (2, 1)  # torchrun's restart on the node left
    assert restart.plan.restart == 1 and restart.resumed_step == first.published[-1][0]
    signalled = first.signalled.extra
    assert signalled["node"] == 1 and len(signalled["pids"]) == 2  # node 1's agent and its worker
    agents = {e.extra["node"]: e.extra["agent"] for e in first.events if e.kind == "ranks" and e.rank is None}
    workers = {e.rank: (e.extra["node"], e.extra["agent"]) for e in first.events if e.kind == "ranks" and e.rank}
    assert workers == {1: (1, agents[1])}  # node 1 is group rank 1 (by its address), its agent the forked one
    assert agents[1] in signalled["pids"] and first.pid not in signalled["pids"]  # the node's agent went with it
    for rec in result.runs:
        assert rec.leftovers == 0
        assert not listening(rec.plan.master_port)


def test_a_sampler_that_keeps_the_old_world_size_after_a_node_is_lost_fails(engine):
    target = on_two_nodes(planted.ddp_saved_world, "ddp_saved_world")
    result = run(engine, target, "ckpt6:node1")
    assert result.verdict.categories == ["LOST"]
    assert result.verdict.headline.startswith("LOST 6 inputs on rank 1 after resume from step_6")
    assert result.verdict.headline.endswith("; node 1 was lost at step 6 and torchrun went on with 1 rank")
    assert "node 1 killed whole (its torchrun agent and workers)" in rp.failure_text(result)
    assert run(engine, target, "ckpt4").verdict.findings == []  # while both nodes live, nothing shows


def test_a_lost_node_that_rejoins_takes_the_job_back_to_every_node_and_passes(engine):
    result = run(engine, on_two_nodes(), "ckpt3:node1:rejoin5")
    assert result.verdict.findings == []
    first, without, back = result.runs
    assert [r.plan.world_size for r in result.runs] == [2, 1, 2]
    assert [r.plan.restart for r in result.runs] == [0, 1, 2]
    assert (without.resumed_step, back.resumed_step) == (3, 5)  # the job without it, then all again from ckpt 5
    reserve = [e.extra["agent"] for e in first.events if e.kind == "ranks" and e.extra.get("reserve")]
    stopped = without.signalled.extra
    assert (stopped["signal"], stopped["rejoin"], stopped["node"], stopped["pids"]) == ("rejoin", 5, 1, reserve)
    assert without.outcome.value == "killed" and "stopped by torchrun for the lost node's return" in without.describe()
    workers = {e.rank: e.extra["agent"] for e in back.events if e.kind == "ranks" and "pid" in e.extra}
    assert workers[1] == reserve[0]  # node 1's worker of the last attempt: started by the agent that was woken
    assert {e.attempt for e in back.events if e.rank is not None} == {2}  # the rendezvous round, not the restart count
    for rec in result.runs:
        assert rec.leftovers == 0
        assert not listening(rec.plan.master_port)


def test_the_agent_of_a_node_never_brought_back_is_killed_when_the_job_ends(engine):
    result = run(engine, on_two_nodes(), "ckpt9:node1:rejoin99")  # the job without it ends long before step 99
    assert result.verdict.findings == []
    assert [r.plan.world_size for r in result.runs] == [2, 1]
    assert [r.leftovers for r in result.runs] == [0, 0]


def test_a_sampler_that_keeps_the_old_world_size_fails_when_the_lost_node_rejoins(engine):
    result = run(engine, on_two_nodes(planted.ddp_saved_world, "ddp_saved_world"), "ckpt3:node1:rejoin5")
    assert result.verdict.categories == ["RESUME_ERROR"]
    assert result.verdict.headline.endswith("; node 1 was lost at step 3 and torchrun went on with 1 rank, until it "
                                            "rejoined after checkpoint 5 (2 ranks again)")
    assert "Invalid rank 1, rank should be in the interval [0, 0]" in rp.failure_text(result)  # one replica kept


def test_a_sampler_that_reads_local_rank_fails_on_two_nodes_and_only_there(engine):
    result = run(engine, on_two_nodes(planted.ddp_local_rank, "ddp_local_rank"), "ckpt6:node1")
    assert set(result.verdict.categories) == {"LOST", "DUPLICATED"}
    assert "on rank 1" in result.verdict.headline and "node 1 was lost at step 6" in result.verdict.headline
    # One node (the harness's launcher, or torchrun's): LOCAL_RANK is RANK, and the same loop passes.
    one_node = ddp_loop.with_options(name="ddp_local_rank_one_node", fn=planted.ddp_local_rank)
    assert run(engine, one_node, "ckpt6:ws1").verdict.findings == []


def test_node_cells_only_where_the_job_can_go_on_without_a_node():
    from pytest_resume_check.cells import matrix

    ids = [c.kill_id for c in matrix.cells(on_two_nodes(), "quick", 0)]
    assert {"ckpt3:node1", "ckpt6:node1", "ckpt9:node1", "ckpt3+1:node1", "ckpt3:node1:rejoin5"} <= set(ids)
    full = [c.kill_id for c in matrix.cells(on_two_nodes(), "full", 0) if "rejoin" in c.kill_id]
    assert full == ["ckpt3:node1:rejoin5", "ckpt6:node1:rejoin8", "ckpt9:node1:rejoin11"]
    fixed = ddp_torchrun.with_options(nnodes=(2, 2), elastic=())
    assert not [i for i in (c.kill_id for c in matrix.cells(fixed, "quick", 0)) if "node" in i]
    assert kill_ids.parse_kill_id("ckpt6:node1")[0].node == 1
    back = kill_ids.parse_kill_id("ckpt3:node1:rejoin5")[0]
    assert (back.node, back.rejoin, kill_ids.kill_id([back])) == (1, 5, "ckpt3:node1:rejoin5")
    with pytest.raises(ValueError, match="only a lost node rejoins: ckpt4:node1:rejoin6"):
        kill_ids.parse_kill_id("ckpt3:rejoin5")


@pytest.mark.parametrize("options, message", [
    ({"nnodes": 2}, "nnodes=2 must be a number of nodes .* needs launcher='torchrun'"),
    ({"launcher": "torchrun", "nnodes": (2, 1)}, r"nnodes=\(2, 1\) must be a number of nodes from 1 to 8"),
    ({"launcher": "torchrun", "nnodes": 3}, r"nnodes=3 .* its most must divide world_size \(2\)"),
    ({"launcher": "torchrun", "nnodes": (1, 2), "elastic": [1]}, "elastic= is not supported with several nodes"),
])
def test_bad_node_options_name_the_fix(options, message):
    from pytest_resume_check.targets import TargetError

    with pytest.raises(TargetError, match=message):
        resume_target(planted.ddp_one_rank, name="bad", steps=4, world_size=2, **options)


def test_the_grid_names_torchruns_rows_where_they_are():
    from pytest_resume_check.report import summary

    def cell(kill_id):
        kills = kill_ids.parse_kill_id(kill_id)
        return {"target": "t", "case_id": "c", "resume_mode": "auto", "kill": kill_id, "passed": True,
                "kills": [k.to_json() for k in kills], "categories": [], "xfail_reason": None}

    head = summary.grid([cell("ckpt2"), cell("ckpt6:agent"), cell("ckpt6:node1")])[0]
    assert head.endswith("wsW: resumed on W ranks, nodeN: node N lost, agent: torchrun's agent alone killed")
    back = summary.grid([cell("ckpt2"), cell("ckpt3:node1:rejoin5")])[0]
    assert back.endswith("nodeN: node N lost, rejoinS: back after checkpoint S")
    assert "agent" not in summary.grid([cell("ckpt2"), cell("ckpt6:rank1")])[0]


# -- a program under torchrun ----------------------------------------------------------------------------

RANK_PROGRAM = Path(__file__).resolve().parents[1] / "support" / "rank_program.py"


def program(*flags, fresh=False, nnodes=1):
    """The stdlib rank program as a command target launched by torchrun: each worker starts the program (in
    its own process, forked from the preloaded server, or a fresh interpreter)."""
    nodes = "_".join(map(str, nnodes)) if isinstance(nnodes, tuple) else str(nnodes)
    name = "_".join(filter(None, ["rank_program", *(f.strip("-").replace("-", "_") for f in flags),
                                  "fresh" * fresh, nodes]))
    return resume_target.command(["{python}", str(RANK_PROGRAM), "{checkpoint_dir}", *flags], name=name,
                                 steps=8, world_size=2, launcher="torchrun", max_restarts=1, nnodes=nnodes,
                                 fresh_interpreter=fresh)


@pytest.mark.parametrize("fresh, kill", [(False, "ckpt3+1"), (False, "ckpt4:agent"), (False, "ckpt4:rank1"),
                                         (True, "ckpt4:rank1")])
def test_a_program_under_torchrun_passes_each_kind_of_kill(engine, fresh, kill):
    result = run(engine, program(fresh=fresh), kill)
    assert result.verdict.findings == []
    assert {e.rank for r in result.runs for e in r.events if e.kind == "consumed"} == {0, 1}
    if kill.endswith(":rank1"):  # torchrun restarted both workers, and both programs reloaded step 4
        assert [r.plan.restart for r in result.runs] == [0, 1]
        assert rp.cell_json(result)["runs"][1]["resumed_by_rank"] == {"0": 4, "1": 4}
    assert all(r.leftovers == 0 for r in result.runs)


def test_the_sigterm_torchrun_sends_a_stopped_worker_reaches_its_program(engine):
    """When rank 1 is killed, torchrun's agent stops rank 0 with SIGTERM before the restart. The program (a
    fresh interpreter, a child of the worker) is what torchrun would have started: it gets the signal, and
    does not go on beside the restart's workers."""
    result = run(engine, program("--term-note", fresh=True), "ckpt4:rank1")
    assert result.verdict.findings == []
    notes = (Path(result.runs[0].plan.checkpoint_dir) / "term.txt").read_text().split()
    assert notes == ["rank", "0"]


def test_a_lost_node_takes_its_programs_with_it_and_the_job_goes_on(engine):
    result = run(engine, program(fresh=True, nnodes=(1, 2)), "ckpt4:node1")
    assert result.verdict.findings == []
    first, restart = result.runs
    assert (first.plan.world_size, restart.plan.world_size) == (2, 1)
    node1 = {e.extra["pid"] for e in first.events if e.kind == "ranks" and e.rank == 1 and "pid" in e.extra}
    programs = {e.extra["program"] for e in first.events if e.kind == "ranks" and e.extra.get("worker") in node1}
    assert len(programs) == 1 and programs <= set(first.signalled.extra["pids"])
    assert all(r.leftovers == 0 for r in result.runs)


def test_a_program_whose_lost_node_rejoins_goes_on_at_each_world_size(engine):
    # Its ranks meet by files named for the attempt: the job without node 1 and the job with it again have the
    # same restart count (a node joining counts none), so only the attempt keeps their rounds apart.
    result = run(engine, program(fresh=True, nnodes=(1, 2)), "ckpt4:node1:rejoin6")
    assert result.verdict.findings == []
    assert [(r.plan.world_size, r.resumed_step) for r in result.runs] == [(2, 0), (1, 4), (2, 6)]
    assert all(rec.leftovers == 0 for rec in result.runs)
