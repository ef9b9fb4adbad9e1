"""Crash cells of a save of several ranks: every rank's file operations and the collectives between them are
recorded, each crash point stops every rank where it no longer needs the others, and the run is killed whole
(a power loss after it loses what any rank had not fsynced). The bundled two-rank DDP loop (DCP shards, a
generator file per rank, latest published by rank 0 after a barrier) passes; a tracker published before every
rank's files are durable, and a resume that takes the newest folder, fail in the cell where they break, naming
the rank and the file. Under torchrun a crash kills the workers and torchrun restarts them within the job (a
loop that looks for a checkpoint only in a resumed job fails there); a power loss ends the job.

Real processes, real gloo rendezvous on loopback, real SIGKILL, files on disk.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import distributed_targets as planted  # noqa: E402

from pytest_resume_check.builtin.targets import ddp_loop, ddp_torchrun  # noqa: E402
from pytest_resume_check.cells import matrix  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import faults  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("ranks"), seed=5, hang_timeout=60, check_determinism=False)
    eng.add_preload(ddp_loop.preload)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def smoke(engine):
    """The correct loop's smoke cells (its save recorded once for the module)."""
    return engine.crash_cells(ddp_loop, matrix.QUICK)


def own(ops, rank):
    return [op for op in ops if op.rank == rank]


def test_each_rank_records_its_own_operations_and_the_collectives_of_the_save(smoke):
    ops = smoke[0].save_ops
    for rank in (0, 1):
        mine = own(ops, rank)
        assert [op.index for op in mine] == list(range(len(mine)))
        assert f"step_2/__{rank}_0.distcp" in {op.path for op in mine}  # its DCP shard
        assert any(op.kind == "replace" and op.target == f"step_2/rng_rank{rank}.pt" for op in mine)
        # DCP's own collectives, then the loop's two barriers: the same ones on every rank.
    assert [op.path for op in own(ops, 0) if op.kind == faults.COLLECTIVE] == [
        op.path for op in own(ops, 1) if op.kind == faults.COLLECTIVE]
    assert [op.path for op in own(ops, 0) if op.kind == faults.COLLECTIVE][-2:] == ["barrier", "barrier"]
    # Only the coordinator writes DCP's metadata and latest.
    assert {op.path for op in own(ops, 0)} >= {"step_2/.metadata.tmp", "latest.tmp"}
    assert not {op.path for op in own(ops, 1)} & {"step_2/.metadata.tmp", "latest.tmp"}


def test_the_two_rank_loop_passes_its_smoke_cells_each_rank_stopped_in_turn(engine, smoke):
    ops = smoke[0].save_ops
    last_file = {r: max(op.index for op in own(ops, r) if op.kind != faults.COLLECTIVE) for r in (0, 1)}
    last_write = {r: max(op.index for op in own(ops, r) if op.kind == "write") for r in (0, 1)}
    totals = (len(own(ops, 0)), len(own(ops, 1)))
    assert [c.kill_id for c in smoke] == [
        f"save2op{last_file[0]}:rank0", f"save2op{last_write[0] + 1}:rank0:power",
        f"save2op{last_file[1]}:rank1", f"save2op{last_write[1] + 1}:rank1:power", f"save2op{totals[0]}:rank0:power"]
    results = [engine.run_cell(c) for c in smoke]
    assert [(r.cell.kill_id, r.verdict.headline) for r in results if not r.passed] == []
    # Before the folder's fsync latest names step_2 already; latest.tmp lost; rank 1 short of the barrier before
    # latest (twice); every rank done and durable.
    assert [r.runs[1].resumed_step for r in results] == [2, 1, 1, 1, 2]
    assert [sorted(r.runs[1].resumed_by_rank) for r in results] == [[0, 1]] * 5
    described = results[3].runs[0].describe()
    assert described.startswith("rank 1 killed before fsync(.../step_2/rng_rank1.pt.tmp); rank 0 stopped before "
                                "barrier()")
    assert "not durable: step_2/rng_rank1.pt.tmp" in described


def test_the_two_rank_loop_passes_a_kill_inside_a_shard_and_between_the_metadata_and_its_rename(engine, smoke):
    ops = smoke[0].save_ops
    every = engine.crash_cells(ddp_loop.with_options(crash_save=(2, 1)), matrix.QUICK)
    assert every[0].save_ops == ops  # the save recorded again: each rank's operations are the same
    shard = [op.index for op in own(ops, 1) if op.kind == "write" and op.path == "step_2/__1_0.distcp"]
    rename = next(op.index for op in own(ops, 0) if op.kind == "rename" and op.target == "step_2/.metadata")
    wanted = {f"save2op{shard[-1]}:rank1", f"save2op{shard[-1]}:rank1:power", f"save2op{rename}:rank0"}
    cells = [c for c in every if c.kill_id in wanted]
    assert len(cells) == 3
    results = [engine.run_cell(c) for c in cells]
    assert [(r.cell.kill_id, r.verdict.headline) for r in results if not r.passed] == []
    assert {r.runs[1].resumed_step for r in results} == {1}


@pytest.mark.parametrize("fn", [planted.ddp_tracker_early, planted.ddp_newest_folder])
def test_a_tracker_before_every_rank_is_durable_or_a_resume_of_the_newest_folder_fails_naming_rank_and_file(
        engine, smoke, fn):
    target = ddp_loop.with_options(name=fn.__name__, fn=fn)
    if fn is planted.ddp_newest_folder:  # it saves as the correct loop does: the correct loop's cells are its own
        cells = [dataclasses.replace(c, target=target) for c in smoke]
    else:
        cells = engine.crash_cells(target, matrix.QUICK)
        # Rank 1 does the same in the planted loop: its operations are those of the correct loop's recording.
        assert own(cells[0].save_ops, 1) == own(smoke[0].save_ops, 1)
    results = [engine.run_cell(c) for c in cells]
    failed = [r for r in results if not r.passed]
    # Only where rank 1's generator file is lost to the power loss while latest (or the newest folder) names step 2.
    assert [r.cell.kills[0].fault.rank for r in failed] == [1]
    assert failed[0].cell.kills[0].fault.mode == faults.MODE_POWER
    assert failed[0].verdict.categories == [vd.RESUME_ERROR]
    headline = failed[0].verdict.headline
    assert "No such file or directory" in headline and "step_2/rng_rank1.pt'" in headline
    assert "; the crash: rank 1 killed before fsync(.../step_2/rng_rank1.pt.tmp)" in headline
    assert "not durable: step_2/rng_rank1.pt.tmp" in headline


def test_under_torchrun_a_crash_is_resumed_by_its_restart_and_a_power_loss_by_the_next_job(engine):
    # The planted loop looks for a checkpoint only when the job was started as a resume: a restart within the job
    # trains from the start. Its ranks save as the correct loop's do, so the correct loop's cells are its cells.
    fresh = engine.crash_cells(ddp_torchrun.with_options(name="ddp_restart_fresh", fn=planted.ddp_restart_fresh),
                               matrix.QUICK)
    kinds = [c.kills[0].fault.mode for c in fresh]
    assert kinds == [faults.MODE_CRASH, faults.MODE_POWER, faults.MODE_CRASH, faults.MODE_POWER, faults.MODE_POWER]
    planted_results = [engine.run_cell(c) for c in fresh]
    correct = [engine.run_cell(dataclasses.replace(c, target=ddp_torchrun)) for c in fresh if c.kills[0].fault.mode
               == faults.MODE_CRASH]
    assert [(r.cell.kill_id, r.verdict.headline) for r in correct if not r.passed] == []
    assert [(r.runs[1].plan.restart, r.runs[1].resumed_step) for r in correct] == [(1, 2), (1, 1)]
    # Killed inside the save: torchrun's restart trained from scratch. A power loss: the next job resumed.
    assert [r.verdict.categories for r in planted_results] == [[vd.STALE_RESUME], [], [vd.STALE_RESUME], [], []]
    assert [r.runs[1].plan.restart for r in planted_results] == [1, 0, 1, 0, 0]
    assert "run 2 resumed from scratch but the checkpoint of step 1" in planted_results[0].verdict.headline


def test_keeping_the_last_checkpoint_passes_and_deleting_the_old_one_before_publishing_fails(engine):
    keep = engine.crash_cells(ddp_loop.with_options(name="ddp_keep_last", fn=planted.ddp_keep_last), matrix.QUICK)
    rmtree = next(op for op in keep[0].save_ops if op.kind == "rmtree")
    assert (rmtree.rank, rmtree.path) == (0, "step_1")  # the deletion is rank 0's, after latest names step_2
    kept = [engine.run_cell(c) for c in keep if c.kill_id in (f"save2op{rmtree.index}:rank0", keep[-1].kill_id)]
    assert [(r.cell.kill_id, r.verdict.headline) for r in kept if not r.passed] == []
    assert [r.runs[1].resumed_step for r in kept] == [2, 2]
    early = engine.crash_cells(ddp_loop.with_options(name="ddp_prune_early", fn=planted.ddp_prune_early), matrix.QUICK)
    failed = [r for r in (engine.run_cell(c) for c in early) if not r.passed]
    # Only the power loss before latest.tmp was durable: latest still names step_1, which is gone.
    assert [(r.cell.kills[0].fault.rank, r.cell.kills[0].fault.mode) for r in failed] == [(0, faults.MODE_POWER)]
    headline = failed[0].verdict.headline
    assert headline.startswith("RESUME_ERROR: run 2 raised while resuming") and "step_1/.metadata" in headline
    assert "; the crash: rank 0 killed before fsync(.../latest.tmp)" in headline


def test_an_asynchronous_save_is_crashed_in_its_writer_thread_too_and_awaiting_it_before_publishing_passes(engine):
    cells = engine.crash_cells(ddp_loop.with_options(name="ddp_async", fn=planted.ddp_async), matrix.QUICK)
    ops = cells[0].save_ops
    for rank in (0, 1):
        main = [op for op in own(ops, rank) if op.lane is None]
        writer = [op for op in own(ops, rank) if op.lane == 1]
        # The main thread starts DCP's writer, writes its generator file, waits for the writer, then publishes.
        assert [op.kind for op in main][:1] == [faults.START] and faults.AWAIT in [op.kind for op in main]
        assert f"step_2/__{rank}_0.distcp" in {op.path for op in writer}
        assert [op.index for op in writer] == list(range(len(writer)))
    threads = [c for c in cells if c.kills[0].fault.lane == 1]
    assert [(c.kills[0].fault.rank, c.kills[0].fault.mode) for c in threads] == [
        (0, faults.MODE_CRASH), (0, faults.MODE_POWER), (1, faults.MODE_CRASH), (1, faults.MODE_POWER)]
    results = [engine.run_cell(c) for c in [*threads, cells[-1]]]
    assert [(r.cell.kill_id, r.verdict.headline) for r in results if not r.passed] == []
    # Killed while a writer was at work: nothing named step_2 yet, the resume takes step_1. After it: step_2.
    assert [r.runs[1].resumed_step for r in results] == [1, 1, 1, 1, 2]
    described = results[0].runs[0].describe()
    assert described.startswith("rank 0 thread 1 killed before")
    assert "rank 0 stopped before Future.result()" in described


def test_an_asynchronous_save_published_before_its_future_completed_fails_while_its_writer_is_at_work(engine):
    # latest names step_2 and keep=1 deletes step_1 before the writer finished: a crash while it is at work leaves
    # latest naming a folder without its metadata.
    cells = engine.crash_cells(ddp_loop.with_options(name="ddp_async_prune", fn=planted.ddp_async_prune),
                               matrix.QUICK)
    threads = [c for c in cells if c.kills[0].fault.lane == 1]
    results = [engine.run_cell(c) for c in [*threads, cells[0]]]
    assert [r.verdict.categories for r in results] == [[vd.RESUME_ERROR]] * len(threads) + [[]]
    headline = results[0].verdict.headline
    assert "step_2/.metadata" in headline and "; the crash: rank 0 thread 1 killed before" in headline
    assert "rank 0 stopped after the last file operation of the save" in headline  # latest already named step_2


def test_over_two_nodes_each_nodes_power_is_lost_alone_and_only_its_ranks_writes_not_fsynced_are_lost(engine):
    """Two simulated nodes of one worker each: after the whole save, node 0's power alone, then node 1's. The correct
    loop passes both. Rank 1 of the planted loop renames its generator file into place without fsyncing it: node
    0's loss leaves every file whole (rank 0 fsynced its own) and passes; node 1's empties that file while latest,
    on node 0, names the folder."""
    two_nodes = planted.ddp_two_nodes.with_options(preload=ddp_loop.preload)
    cells = engine.crash_cells(two_nodes, matrix.QUICK)
    nodes = [c for c in cells if c.kills[0].fault.node is not None]
    total = len(own(cells[0].save_ops, 0))
    assert [c.kill_id for c in nodes] == [f"save2op{total}:rank0:power:node0", f"save2op{total}:rank0:power:node1"]
    assert [(r.cell.kill_id, r.verdict.headline) for r in map(engine.run_cell, nodes) if not r.passed] == []
    unsynced = two_nodes.with_options(name="ddp_unsynced_rank1", fn=planted.ddp_unsynced_rank1)
    machine, node0, node1 = (engine.run_cell(dataclasses.replace(c, target=unsynced)) for c in
                             [next(c for c in cells if c.kill_id == f"save2op{total}:rank0:power"), *nodes])
    assert (machine.passed, node0.passed, node1.passed) == (False, True, False)
    assert node0.runs[0].damage.not_durable == ()
    assert node1.runs[0].damage.not_durable == (("step_2/rng_rank1.pt", 0),)
    assert node1.verdict.categories == [vd.RESUME_ERROR]
    assert "power lost on node 1 alone (rank 1: the other nodes' writes kept); not durable: step_2/rng_rank1.pt " \
        in node1.verdict.headline
