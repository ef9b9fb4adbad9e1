"""The runs' environment without processes: which variables count, whose code's reads are noted, how two
machines' values are compared without either sending them, and the names a cell's JSON carries."""

from __future__ import annotations

import os

import pytest

from pytest_resume_check.cluster import executor as ex
from pytest_resume_check.records import environ
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.records.results import RunRecord

KEY = "k" * 32


def plan(**changes) -> RunPlan:
    return RunPlan("t", ("m", "f", "train"), {}, 1, "/c", "/l", **changes)


# -- which variables count -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["HOME", "PATH", "LC_ALL", "SSH_AUTH_SOCK", "RANK", "MASTER_PORT",
                                  "CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER", "PYTEST_RESUME_CHECK_RUN",
                                  "RESUME_CHECK_FD", "TORCHELASTIC_RESTART_COUNT", "RAY_ADDRESS"])
def test_the_machines_and_the_harnesss_variables_do_not_count(name):
    assert not environ.counts(name)


def test_a_projects_variable_counts_unless_the_harness_set_it_for_the_run():
    assert environ.counts("TRAINER_MODE") and environ.counts("MY_SERVER")
    assert not environ.counts("MY_SERVER", environ.harness_names(plan(env={"MY_SERVER": "db:1"})))


def test_the_harness_names_what_it_set_for_a_run():
    assert environ.harness_names(plan()) == ["PYTEST_RESUME_CHECK_RUN"]
    names = environ.harness_names(plan(env={"MY_SERVER": "db:1"}, world_size=2, master_port=29500))
    assert names == sorted(["MY_SERVER", "PYTEST_RESUME_CHECK_RUN", *environ.RANK_NAMES])


def test_names_are_read_from_commas_and_spaces_once_each():
    assert environ.parse_names("A,B  C,,A") == ("A", "B", "C")
    assert environ.parse_names(["A", "B,_C1"]) == ("A", "B", "_C1")
    with pytest.raises(ValueError, match="1A"):
        environ.parse_names("A,1A")
    with pytest.raises(TypeError):
        environ.parse_names([None])


def test_only_the_projects_own_code_is_noted(tmp_path):
    from pytest_resume_check.child import environ as reads

    noted = reads.Reads()
    noted._outside = reads._library_folders()
    (tmp_path / "train.py").write_text("")
    assert noted._is_project(str(tmp_path / "train.py"))
    for library in (os.__file__, reads.__file__, ex.__file__, "/opt/env/lib/python3.11/site-packages/torch/a.py",
                    "/usr/lib/python3/dist-packages/ray/b.py", "<string>", "<frozen os>"):
        assert not noted._is_project(library), library


# -- comparing without values ----------------------------------------------------------------------------------

def test_a_variable_differs_when_missing_on_one_side_or_valued_otherwise():
    here = {"SAME": "1", "OTHER": "fast", "ONLY_HERE": "x"}
    node = {"SAME": "1", "OTHER": "slow", "ONLY_THERE": "y"}
    theirs = environ.digests(["SAME", "OTHER", "ONLY_HERE", "ONLY_THERE", "NOWHERE"], KEY, node)
    assert environ.differing(theirs, KEY, here) == ["ONLY_HERE", "ONLY_THERE", "OTHER"]
    # A declared variable was set on the node from here: not compared.
    assert environ.differing(theirs, KEY, here, declared=["OTHER", "ONLY_HERE"]) == ["ONLY_THERE"]


def test_a_digest_keeps_the_value_to_itself_and_depends_on_the_sessions_key():
    digest = environ.digest(KEY, "hunter2-secret")
    assert digest is not None and "hunter2" not in digest and len(digest) == 32
    assert environ.digest("other" * 6, "hunter2-secret") != digest
    assert environ.digest(KEY, None) is None and environ.digest(KEY, "") is not None  # set but empty: set


# -- what a cell's JSON says -----------------------------------------------------------------------------------

def test_a_runs_reads_are_its_environ_events_in_order():
    from pytest_resume_check.report.text import environment_json

    events = [ev.Event(ev.ENVIRON, text="B"), ev.Event(ev.STEP_END, step=1), ev.Event(ev.ENVIRON, text="A", rank=1),
              ev.Event(ev.ENVIRON, text="B", rank=1)]
    record = RunRecord(plan(env={"MY_SERVER": "db"}), events)
    assert record.environ_read == ["B", "A"]
    assert ev.Event.from_wire(events[0].to_wire()) == events[0]

    class Result:
        reference = RunRecord(plan(), [ev.Event(ev.ENVIRON, text="C")])
        runs = [record]

    assert environment_json(Result()) == {"read": ["A", "B", "C"], "harness": ["MY_SERVER", "PYTEST_RESUME_CHECK_RUN"]}
