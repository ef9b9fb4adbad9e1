"""Crash smoke cells: which targets get them by default, which save and which faults,
and how a declaration turns them off or asks for the whole crash axis (no processes, no torch)."""

from __future__ import annotations

import pytest

from pytest_resume_check.cells import matrix
from pytest_resume_check.records import faults, kill_ids
from pytest_resume_check.records.faults import FileOp
from pytest_resume_check.run import RESUME_AUTO, RESUME_PATH
from pytest_resume_check.targets import CRASH_SMOKE, TargetError, resume_target


def some_target(run):  # module level: targets must be importable by name
    pass


def make(**kw):
    kw.setdefault("steps", 6)
    return resume_target(some_target, **kw)


#: A save through durable renames: each file written to a temporary name, fsynced, renamed.
ATOMIC = (FileOp(0, "mkdir", "step_2"), FileOp(1, "open", "step_2/state.pt.tmp"),
          FileOp(2, "write", "step_2/state.pt.tmp"), FileOp(3, "write", "step_2/state.pt.tmp"),
          FileOp(4, "fsync", "step_2/state.pt.tmp"), FileOp(5, "close", "step_2/state.pt.tmp"),
          FileOp(6, "replace", "step_2/state.pt.tmp", "step_2/state.pt"), FileOp(7, "open", "latest.tmp"),
          FileOp(8, "write", "latest.tmp"), FileOp(9, "fsync", "latest.tmp"), FileOp(10, "close", "latest.tmp"),
          FileOp(11, "replace", "latest.tmp", "latest"), FileOp(12, "fsync", "."))
#: The same save written in place: torch.save to the path, then the pointer file, neither fsynced.
IN_PLACE = (FileOp(0, "mkdir", "step_2"), FileOp(1, "torch.save", "step_2/state.pt"), FileOp(2, "open", "latest"),
            FileOp(3, "write", "latest"), FileOp(4, "close", "latest"))


def smoke_ids(ops, step=2):
    return [kill_ids.fault_label(plan) for plan in matrix.smoke_plans(ops, step)]


def test_a_target_that_declares_nothing_gets_smoke_cells_of_the_save_of_step_2_after_step_1():
    target = make()
    assert target.crash_save == CRASH_SMOKE
    assert matrix.crash_axis(target) == matrix.CrashAxis(2, 1, smoke=True)


def test_crash_save_step_prior_still_asks_for_every_crash_point_of_that_save():
    assert matrix.crash_axis(make(crash_save=(3, 1))) == matrix.CrashAxis(3, 1, smoke=False)
    assert matrix.crash_axis(make(crash_save=[4, 2])) == matrix.CrashAxis(4, 2, smoke=False)


@pytest.mark.parametrize("off", [False, None])
def test_crash_save_false_turns_the_smoke_cells_off(off):
    target = make(crash_save=off)
    assert target.crash_save is None and matrix.crash_axis(target) is None


@pytest.mark.parametrize("options", [
    {"resume_modes": (RESUME_PATH,)},  # a crash cell resumes from what the crash left in its own folder
    {"steps": 1},  # no checkpoint before the faulted save
    {"steps": lambda case: 1 if case.get("short") else 6, "cases": [{"short": True}, {}]},  # the first case
])
def test_targets_the_smoke_cells_cannot_apply_to_get_none(options):
    assert matrix.crash_axis(make(**options)) is None


@pytest.mark.parametrize("launcher", ["harness", "torchrun"])
def test_a_multi_rank_target_gets_smoke_cells_and_the_whole_axis_with_either_launcher(launcher):
    assert matrix.crash_axis(make(world_size=2, launcher=launcher)) == matrix.CrashAxis(2, 1, smoke=True)
    assert matrix.crash_axis(make(world_size=2, launcher=launcher, crash_save=(2, 1))) == matrix.CrashAxis(
        2, 1, smoke=False)


def test_two_steps_and_auto_resume_are_enough_for_smoke_cells():
    assert matrix.crash_axis(make(steps=2, resume_modes=(RESUME_AUTO,))) == matrix.CrashAxis(2, 1, smoke=True)


@pytest.mark.parametrize("bad", [(2,), (1, 2), (2, 2), (2, -1), (2.0, 1), ("2", "1"), (True, 0), "full", True, 3])
def test_a_crash_save_that_is_none_of_the_three_forms_is_refused_with_them(bad):
    with pytest.raises(TargetError) as error:
        make(crash_save=bad)
    message = str(error.value)
    assert f"crash_save={bad!r} is not one of 'smoke'" in message
    assert "crash_save=(2, 1)" in message and "False (no crash cells)" in message


def test_an_atomic_save_gets_a_kill_before_its_last_operation_and_power_losses_after_its_last_write_and_op():
    assert matrix.tearable_files(ATOMIC) == []  # nothing to tear: every file was durable before its name
    assert smoke_ids(ATOMIC) == ["op12", "op9:power", "op13:power"]  # op 8 wrote latest.tmp


def test_a_save_written_in_place_also_gets_its_last_written_file_torn():
    assert smoke_ids(IN_PLACE) == ["op4", "op4:power", "op5:power", "op5:torn:latest"]


def test_a_save_whose_writes_the_recorder_does_not_see_gets_the_kill_and_the_power_loss_at_its_end():
    renamed = (FileOp(0, "fsync", ".ckpt.partial"), FileOp(1, "replace", ".ckpt.partial", "step_2.ckpt"),
               FileOp(2, "fsync", "."))  # written by native code, then fsynced and renamed
    assert smoke_ids(renamed) == ["op2", "op3:power"]


def test_a_save_whose_last_operation_is_a_write_gets_one_power_loss():
    assert smoke_ids((FileOp(0, "mkdir", "step_2"), FileOp(1, "torch.save", "step_2/state.pt"))) == [
        "op1", "op2:power", "op2:torn:step_2/state.pt"]


def test_the_smoke_cells_stay_few_however_many_operations_and_files_the_save_has():
    ops = [FileOp(0, "mkdir", "step_2")]
    for n in range(40):  # 40 files, each written in place
        ops += [FileOp(len(ops), "open", f"step_2/shard{n}"), FileOp(len(ops) + 1, "write", f"step_2/shard{n}"),
                FileOp(len(ops) + 2, "close", f"step_2/shard{n}")]
    assert smoke_ids(ops) == ["op120", "op120:power", "op121:power", "op121:torn:step_2/shard39"]


def test_a_save_the_recorder_saw_nothing_of_gets_no_smoke_cells():
    assert matrix.smoke_plans((), 2) == []


def test_smoke_cells_resume_automatically_after_a_prior_checkpoint_and_carry_expected_failures():
    torn = "the pointer file is written in place"
    target = make(expected_failures=[(lambda cell: cell.kills[0].fault.mode == faults.MODE_TORN, torn)])
    cells = matrix.smoke_cells(target, target.cases[0], IN_PLACE, 2, 1)
    assert [c.kill_id for c in cells] == ["save2op4", "save2op4:power", "save2op5:power", "save2op5:torn:latest"]
    assert {(c.resume_mode, c.prior_checkpoints, c.save_ops, c.steps) for c in cells} == {
        (RESUME_AUTO, (1,), IN_PLACE, 6)}
    assert [c.xfail_reason for c in cells] == [None, None, None, torn]
    assert all(c.kills[0].fault.total == len(IN_PLACE) for c in cells)


def test_an_expected_failure_predicate_that_raises_names_the_target():
    def broken(cell):
        raise KeyError("mode")

    target = make(name="smoky", expected_failures=[(broken, "never")])
    with pytest.raises(TargetError, match="target 'smoky': expected_failures.*KeyError"):
        matrix.smoke_cells(target, target.cases[0], IN_PLACE, 2, 1)


def ranked(rank, kinds, lane=None):
    """A lane's ops from (kind, path) pairs, numbered in that lane of that rank."""
    return [FileOp(i, kind, path, None, rank, lane) for i, (kind, path) in enumerate(kinds)]


def at(*stops):
    """Stops of the main threads of ranks 0, 1, ...: ((0, 0, a), (1, 0, b), ...)."""
    return tuple((rank, 0, stop) for rank, stop in enumerate(stops))


#: Two ranks: each writes its shard durably, a barrier, then rank 0 alone publishes latest, a barrier.
TWO_RANKS = tuple(
    ranked(0, [("open", "s/r0.tmp"), ("write", "s/r0.tmp"), ("fsync", "s/r0.tmp"), ("close", "s/r0.tmp"),
               ("replace", "s/r0.tmp"), (faults.COLLECTIVE, "barrier"), ("open", "latest.tmp"),
               ("write", "latest.tmp"), ("fsync", "latest.tmp"), ("close", "latest.tmp"), ("replace", "latest.tmp"),
               (faults.COLLECTIVE, "barrier")])
    + ranked(1, [("open", "s/r1.tmp"), ("write", "s/r1.tmp"), ("fsync", "s/r1.tmp"), ("close", "s/r1.tmp"),
                 ("replace", "s/r1.tmp"), (faults.COLLECTIVE, "barrier"), (faults.COLLECTIVE, "barrier")]))


def test_a_rank_stopped_anywhere_leaves_the_others_at_the_end_of_the_same_stretch_between_collectives():
    # Rank 1 inside its shard: rank 0 finished its own and waits before the first barrier.
    assert faults.stops_at(TWO_RANKS, 1, 2) == at(5, 2)
    # Rank 0 before latest's rename: rank 1 passed the first barrier and waits before the second.
    assert faults.stops_at(TWO_RANKS, 0, 10) == at(10, 6)
    # Before a collective is the end of the stretch before it; after every op, every rank at its end.
    assert faults.stops_at(TWO_RANKS, 1, 5) == faults.stops_at(TWO_RANKS, 0, 5) == at(5, 5)
    assert faults.stops_at(TWO_RANKS, 0, 12) == at(12, 7)


def test_the_smoke_cells_of_two_ranks_stop_each_rank_in_turn_and_name_it():
    plans = matrix.ranked_plans(TWO_RANKS, 2, matrix.QUICK, smoke=True)
    # Each rank before its last file op, and right after its last write with a power loss; then both at their end.
    assert [kill_ids.fault_label(p) for p in plans] == [
        "op10:rank0", "op8:rank0:power", "op4:rank1", "op2:rank1:power", "op12:rank0:power"]
    assert [p.stops for p in plans] == [at(10, 6), at(8, 6), at(5, 4), at(5, 2), at(12, 7)]
    assert [p.completes_save for p in plans] == [False, False, False, False, True]
    assert {p.totals for p in plans} == {at(12, 7)}


def test_the_whole_axis_of_two_ranks_has_each_cut_of_every_rank_once():
    plans = matrix.ranked_plans(TWO_RANKS, 2, matrix.FULL, smoke=False)
    crash = [p for p in plans if p.mode == faults.MODE_CRASH]
    assert len({p.stops for p in crash}) == len(crash)  # the cut at a collective, the same for each rank, once
    # Every op of each rank, and each rank's end, is where its rank is stopped in some cell; rank 1 before its
    # barriers and at its end is rank 0 before the same barriers and at its end.
    every = {(r, i) for r, n in ((0, 12), (1, 7)) for i in range(n + 1)}
    assert every - {(p.rank, p.op) for p in crash} == {(1, 5), (1, 6), (1, 7)}
    again = kill_ids.parse_fault_label(2, kill_ids.fault_label(crash[3]))
    assert (again.rank, again.op, again.mode) == (crash[3].rank, crash[3].op, crash[3].mode)
    # A plan travels to the run and to the report as JSON and comes back the same.
    assert faults.FaultPlan.from_json(crash[3].to_json()) == crash[3]


def test_ranks_that_enter_no_collective_get_only_the_smoke_cell_that_stops_none_of_them_early():
    # A program whose ranks wait for each other by files: a rank stopped alone could leave the others waiting.
    no_collectives = tuple(op for op in TWO_RANKS if op.kind != faults.COLLECTIVE)
    plans = matrix.ranked_plans(no_collectives, 2, matrix.QUICK, smoke=True)
    assert [(kill_ids.fault_label(p), p.stops, p.completes_save) for p in plans] == [
        ("op10:rank0:power", at(10, 5), True)]


def main_lane(rank, latest):
    """An asynchronous save's main thread: start the writer (lane 1), write its own file, wait for the writer,
    a barrier, latest (rank 0), a barrier."""
    kinds = [(faults.START, "thread 1"), ("open", f"s/rng{rank}.tmp"), ("fsync", f"s/rng{rank}.tmp"),
             ("replace", f"s/rng{rank}.tmp"), (faults.AWAIT, "Future.result"), (faults.COLLECTIVE, "barrier")]
    kinds += [("open", "latest.tmp"), ("replace", "latest.tmp")] if latest else []
    return ranked(rank, kinds + [(faults.COLLECTIVE, "barrier")])


def writer_lane(rank):
    """The writer: plan (a collective of lane 1 of every rank), its shard, the metadata's collective."""
    shard = f"s/shard{rank}"
    return ranked(rank, [(faults.COLLECTIVE, "gather_object"), ("open", shard), ("write", shard), ("fsync", shard),
                         ("close", shard), (faults.COLLECTIVE, "gather_object")], lane=1)


ASYNC = tuple(main_lane(0, True) + writer_lane(0) + main_lane(1, False) + writer_lane(1))


def test_an_asynchronous_writer_stopped_holds_its_rank_before_its_wait_and_the_writers_before_their_collective():
    # Rank 1's writer inside its shard: both main threads wait right before their wait for the writer (rank 0's
    # has nothing to wait for there, but its barrier needs rank 1), rank 0's writer before the last collective.
    assert faults.stops_at(ASYNC, 1, 3, lane=1) == ((0, 0, 4), (0, 1, 5), (1, 0, 4), (1, 1, 3))
    # Rank 0's main thread before latest's rename: every writer done, rank 1 before the last barrier.
    assert faults.stops_at(ASYNC, 0, 7) == ((0, 0, 7), (0, 1, 6), (1, 0, 6), (1, 1, 6))
    # Rank 0's main thread before it starts its writer: that writer never runs (left out), so rank 1's writer
    # cannot pass its first collective, and rank 1's main thread waits before its wait for it.
    assert faults.stops_at(ASYNC, 0, 0) == ((0, 0, 0), (1, 0, 4), (1, 1, 0))
    # Rank 0's main thread past its wait, before the first barrier: its writer at its end (and so rank 1's), rank
    # 1's main thread before the same barrier.
    assert faults.stops_at(ASYNC, 0, 5) == ((0, 0, 5), (0, 1, 6), (1, 0, 5), (1, 1, 6))


def test_the_smoke_cells_of_an_asynchronous_save_stop_each_thread_of_each_rank():
    plans = matrix.ranked_plans(ASYNC, 2, matrix.QUICK, smoke=True)
    labels = [kill_ids.fault_label(p) for p in plans]
    # Per thread of each rank: before its last file op, after its last write with a power loss (the main threads
    # write no data here); every thread at its end; latest.tmp, written in place, torn.
    assert labels == ["op7:rank0", "op4:rank0:thread1", "op3:rank0:thread1:power", "op3:rank1", "op4:rank1:thread1",
                      "op3:rank1:thread1:power", "op9:rank0:power", "op7:rank0:torn:latest.tmp"]
    assert [p.completes_save for p in plans] == [False] * 6 + [True, False]
    again = kill_ids.parse_fault_label(2, "op3:rank0:thread1:power")
    assert (again.rank, again.lane, again.op, again.mode) == (0, 1, 3, faults.MODE_POWER)


# -- a power loss of one simulated node alone -----------------------------------------------------------------

def test_a_save_over_two_nodes_also_loses_each_nodes_power_alone_after_the_whole_save():
    plans = matrix.ranked_plans(TWO_RANKS, 2, matrix.QUICK, smoke=True, nodes=2)
    labels = [kill_ids.fault_label(p) for p in plans]
    assert labels == ["op10:rank0", "op8:rank0:power", "op4:rank1", "op2:rank1:power", "op12:rank0:power",
                      "op12:rank0:power:node0", "op12:rank0:power:node1"]
    assert {p.stops for p in plans[-3:]} == {at(12, 7)}
    again = kill_ids.parse_fault_label(2, "op12:rank0:power:node1")
    assert (again.mode, again.op, again.rank, again.node) == (faults.MODE_POWER, 12, 0, 1)
    assert faults.FaultPlan.from_json(plans[-1].to_json()) == plans[-1]
    # The whole axis: every power loss once more for each node.
    full = matrix.ranked_plans(TWO_RANKS, 2, matrix.FULL, smoke=False, nodes=2)
    machine = [p for p in full if p.mode == faults.MODE_POWER and p.node is None]
    assert sorted((p.rank, p.op, p.node) for p in full if p.node is not None) == sorted(
        (p.rank, p.op, node) for p in machine for node in (0, 1))


def test_only_the_ranks_of_the_node_that_lost_its_power_lose_their_writes_not_fsynced():
    ready = [(0, {faults.EXTRA_UNSYNCED: {"latest": 0}}), (1, {faults.EXTRA_UNSYNCED: {"s/r1": 3}})]
    assert faults.merge_kill_extras(ready) == {faults.EXTRA_UNSYNCED: {"latest": 0, "s/r1": 3}}
    node1 = faults.FaultPlan(2, faults.MODE_POWER, 12, rank=0, node=1)
    assert list(node1.lost_ranks(1)) == [1] and list(node1.lost_ranks(2)) == [2, 3]
    assert faults.merge_kill_extras(ready, node1.lost_ranks(1)) == {faults.EXTRA_UNSYNCED: {"s/r1": 3}}
    assert faults.merge_kill_extras(ready, range(2, 4)) == {}
    assert faults.FaultPlan(2, faults.MODE_POWER, 12).lost_ranks(1) is None


def test_a_target_spread_over_simulated_nodes_is_one_of_torchruns():
    torchrun, harness = make(world_size=2, launcher="torchrun", nnodes=(1, 2)), make(world_size=2)
    assert (matrix.simulated_nodes(torchrun), matrix.simulated_nodes(harness)) == (2, 1)
