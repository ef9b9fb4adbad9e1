"""The parts of ``--resume-matrix-ray`` that need no cluster: a group's records read while they are written,
a failing cell's kept folders packed on the node and unpacked here (or named where they stayed), what
the executor does when a task's node is lost (with real Ray exceptions, where Ray is installed), and the
header's and the summary's lines on where the cells run."""

from __future__ import annotations

import pytest
from optional import requires

from pytest_resume_check.cluster import wire


def test_records_are_read_whole_lines_only(tmp_path):
    path = tmp_path / "cells.jsonl"
    assert wire.read_new(str(path), 0) == ([], 0)
    wire.write(str(path), {"name": "a", "outcome": wire.PASSED})
    with open(path, "a") as f:
        f.write('{"name": "b", "out')  # the writer is in the middle of a line
    records, offset = wire.read_new(str(path), 0)
    assert [r["name"] for r in records] == ["a"]
    with open(path, "a") as f:
        f.write('come": "failed"}\n')
    records, offset = wire.read_new(str(path), offset)
    assert records == [{"name": "b", "outcome": "failed"}] and offset == path.stat().st_size


class FakeRay:
    """Ray as the executor's follower thread sees it: ``get`` of a reference, the exceptions (Ray's own)
    and the nodes alive; tasks are lists of records, one ending in the exception it raises."""

    def __init__(self, nodes):
        import ray.exceptions

        self.exceptions = ray.exceptions
        self._nodes = nodes

    def get(self, ref):
        return ref

    def nodes(self):
        return self._nodes


class Submitted:
    """A ``remote`` whose tasks yield the records given for each submission in turn."""

    def __init__(self, runs):
        self.runs = list(runs)
        self.specs = []

    def options(self, **options):
        return self

    def remote(self, spec, control):
        self.specs.append(spec)
        return iter_raising(self.runs.pop(0))


def iter_raising(records):
    for record in records:
        if isinstance(record, BaseException):
            raise record
        yield record


def executor(tmp_path, retries, nodes):
    from pytest_resume_check.cluster import executor as ex

    runner = ex.RayExecutor(ex.Settings("127.0.0.1:1", retries, 0, "--ray", "--ray-retries", "--ray-copy"), tmp_path)
    runner._ray = FakeRay(nodes)
    return runner


def node_died():
    import ray.exceptions

    return ray.exceptions.NodeDiedError("Task failed because the node it was running on is dead or unavailable.")


ALIVE = [{"Alive": True, "NodeManagerAddress": "127.0.0.1", "Resources": {"CPU": 1.0}}]
NODE = {"node": {"node_id": "ab" * 28, "ip": "10.0.0.2", "host": "second"}}


@requires("ray")
@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_node_fails_its_unfinished_cells_or_runs_them_again(tmp_path, retries):
    from pytest_resume_check.cluster import executor as ex

    runner = executor(tmp_path, retries, ALIVE)
    first = [NODE, {"name": "c1", "outcome": wire.PASSED}, node_died()]
    again = [NODE, {"name": "c2", "outcome": wire.PASSED}, {"name": "c3", "outcome": wire.PASSED},
             {"ended": 0, "tail": []}]
    remote = Submitted([first, again])
    task = ex.Task("t ok auto", ["c1", "c2", "c3"], {"args": []},
                   {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {}})
    runner._tasks.append(task)
    runner._submit(task, remote)
    outcomes = {name: runner.outcome(name) for name in ("c1", "c2", "c3")}
    assert outcomes["c1"].kind == wire.PASSED
    if retries:  # the two unfinished cells ran again, in a task of their own
        assert len(remote.specs) == 2 and [o.kind for o in outcomes.values()] == [wire.PASSED] * 3
    else:
        assert len(remote.specs) == 1
        for name in ("c2", "c3"):
            got = outcomes[name]
            assert got.kind == wire.FAILED and got.category == "HARNESS" and "\n" not in got.text
            assert got.text.startswith("HARNESS: Ray node 10.0.0.2 (second, node id abababababab) was lost while it "
                                       "ran this cell's group (NodeDiedError); nothing was judged: rerun the cell, "
                                       "or give --ray-retries=1")


@requires("ray")
def test_no_retry_where_no_node_left_has_the_resources(tmp_path):
    from pytest_resume_check.cluster import executor as ex

    runner = executor(tmp_path, 3, ALIVE)  # only a node without the "second" resource is left
    remote = Submitted([[NODE, node_died()]])
    task = ex.Task("t ok auto", ["c1"], {"args": []},
                   {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {"second": 1.0}})
    runner._tasks.append(task)
    runner._submit(task, remote)
    assert runner.outcome("c1").category == "HARNESS" and len(remote.specs) == 1


@requires("ray")
def test_a_group_that_ends_without_a_cell_says_why(tmp_path):
    from pytest_resume_check.cluster import executor as ex

    runner = executor(tmp_path, 0, ALIVE)
    tail = ["collected 0 items", "ERROR: --resume-matrix-cell 'x': no such cell in this matrix"]
    remote = Submitted([[NODE, {"ended": 4, "tail": tail}]])
    task = ex.Task("t ok auto", ["c1"], {"args": []}, {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {}})
    runner._tasks.append(task)
    runner._submit(task, remote)
    got = runner.outcome("c1")
    assert got.text == ("HARNESS: the group's pytest on node 10.0.0.2 (second, node id abababababab) ended with exit "
                        "code 4 before this cell had an outcome: ERROR: --resume-matrix-cell 'x': no such cell in "
                        "this matrix")


def test_kept_folders_come_back_into_this_session_or_are_named_where_they_stayed(tmp_path):
    from pytest_resume_check.cluster import executor as ex
    from pytest_resume_check.cluster.node import Group

    remote = tmp_path / "node" / "resume-matrix0"
    cell, reference = remote / "t" / "ok" / "auto-ckpt1", remote / "t" / "ok" / "reference"
    for folder in (cell, reference):
        (folder / "out").mkdir(parents=True)
        (folder / "run0.log").write_text(f"the log of {folder.name}\n")
    (cell / "restored-run1").write_bytes(b"\0" * 1000)
    record = {"name": "t[ok-auto-ckpt1]", "outcome": wire.FAILED, "root": str(remote),
              "text": f"LOST: 1 input\n  kept: {cell} (checkpoints) and {reference} (the uninterrupted runs)",
              "cell_json": {"runs": [{"log_file": str(cell / "run0.log")}], "rerun": "pytest x"},
              "kept": [str(cell), str(reference)], "reference_seconds": 0.5}
    here = tmp_path / "here" / "resume-matrix0"
    here.mkdir(parents=True)
    runner = ex.RayExecutor(ex.Settings("a:1", 0, 10_000, "--ray", "--ray-retries", "--ray-copy"), here)
    task = ex.Task("t ok auto", [record["name"]], {}, {}, node={"ip": "10.0.0.2", "host": "n2", "node_id": "c" * 56})

    group = Group({"session": "s" * 32, "copy_limit": 10_000})
    try:
        got = runner._outcome_of(group._with_evidence(dict(record)), task)
    finally:
        group.stop()
    assert not group.folder.exists()
    assert (here / "t" / "ok" / "auto-ckpt1" / "run0.log").read_text() == "the log of auto-ckpt1\n"
    assert (here / "t" / "ok" / "reference" / "run0.log").is_file()
    assert str(remote) not in got.text and f"kept: {here}/t/ok/auto-ckpt1 (checkpoints)" in got.text
    assert got.cell_json["runs"][0]["log_file"] == f"{here}/t/ok/auto-ckpt1/run0.log"

    small = Group({"session": "s" * 32, "copy_limit": 100})  # 1000 bytes of one file alone are more
    try:
        got = runner._outcome_of(small._with_evidence(dict(record)), task)
        assert small.keep and small.folder.exists()
    finally:
        small.stop()
        small.keep = False
        small.stop()
    assert f"kept: {cell} (checkpoints)" in got.text  # the node's paths, named
    assert got.text.endswith(f"kept on node 10.0.0.2 (n2, node id cccccccccccc) (not copied back: 0 MB, more than "
                             f"--ray-copy=0.00953674): {cell}, {reference}")
    assert got.cell_json["kept_on_node"]["paths"] == [str(cell), str(reference)]


def test_the_header_names_the_cluster_and_each_node_with_its_resources(tmp_path):
    from pytest_resume_check.cluster import executor as ex

    runner = ex.RayExecutor(ex.Settings("10.0.0.5:6379", 0, 0, "--ray", "--ray-retries", "--ray-copy"), tmp_path)
    runner.nodes = [{"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.5", "NodeManagerHostname": "head",
                     "Resources": {"CPU": 8.0, "memory": 1e9, "node:10.0.0.5": 1.0}},
                    {"NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.6", "NodeManagerHostname": "gpu-box",
                     "Resources": {"CPU": 4.0, "GPU": 1.0}}]
    assert runner.header() == ("resume-check: cells run on the Ray cluster at 10.0.0.5:6379: 2 nodes alive: 10.0.0.5 "
                               "(head, node id aaaaaaaaaaaa) with CPU 8; 10.0.0.6 (gpu-box, node id bbbbbbbbbbbb) "
                               "with CPU 4, GPU 1")


def test_the_summary_says_how_many_cells_ran_on_each_node(tmp_path):
    from pytest_resume_check.cluster import executor as ex

    runner = ex.RayExecutor(ex.Settings("a:1", 0, 0, "--ray", "--ray-retries", "--ray-copy"), tmp_path)
    assert runner.placement() is None
    second = {"ip": "10.0.0.2", "host": "n2", "node_id": "c" * 56}
    head = {"ip": "10.0.0.1", "host": "n1", "node_id": "d" * 56}
    task = ex.Task("t ok auto", ["t[ok-auto-ckpt1]"], {}, {}, node=second)
    got = runner._outcome_of({"name": "t[ok-auto-ckpt1]", "outcome": wire.PASSED, "cell_json": {"rerun": "x"}}, task)
    assert got.node == second
    runner._answer("t[ok-auto-ckpt1]", got)
    runner._answer("t[ok-auto-ckpt2]", ex.CellOutcome(wire.PASSED, node=second))
    runner._answer("t[ok-path-ckpt1]", ex.CellOutcome(wire.PASSED, node=head))
    runner._answer("u[g-auto-ckpt1]", ex.CellOutcome(wire.FAILED, "TARGET_ERROR: ...", category="TARGET_ERROR"))
    assert runner.placement() == ("resume-check: 4 cells ran on the Ray cluster at a:1: 2 on node 10.0.0.2 (n2, node "
                                  "id cccccccccccc), 1 on node 10.0.0.1 (n1, node id dddddddddddd), 1 without one "
                                  "(refused or lost: each says why)")
