"""The runs' environment without processes: which variables count, how a node's and this machine's
values are compared without either sending them, what a declaration forwards to a node, the warning for
variables that differ, the cell JSON's names and a reproduction's README section on setting them."""

from __future__ import annotations

import os

import pytest

from pytest_resume_check.cluster import executor as ex
from pytest_resume_check.cluster import wire
from pytest_resume_check.cluster.node import group_environment
from pytest_resume_check.plugin import environment
from pytest_resume_check.plugin.settings import Settings
from pytest_resume_check.records import environ
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.names import OPT_ENV
from pytest_resume_check.records.plan import CommandSpec, RunPlan
from pytest_resume_check.records.results import RunRecord
from pytest_resume_check.report import repro
from pytest_resume_check.targets import TargetError, resume_target

KEY = "k" * 32


def train(run):
    """A target function (never run here)."""


def settings(*env: str) -> Settings:
    return Settings(mode="quick", seed=1, targets=(), cells=(), hang_timeout=60.0, json_path=None, isolation=None,
                    env=env)


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


def test_a_target_declares_the_variables_it_passes_on():
    assert resume_target(train, steps=2, pass_env=["TRAINER_MODE", "DATA_ROOT,TRAINER_MODE"]).pass_env == (
        "TRAINER_MODE", "DATA_ROOT")
    for bad in (["TRAINER-MODE"], 3, [None]):
        with pytest.raises(TargetError, match="pass_env=.* must name environment variables"):
            resume_target(train, steps=2, pass_env=bad)


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


def test_the_executor_names_the_variables_a_nodes_runs_read_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("RC_UNIT_A", "here")
    monkeypatch.setenv("RC_UNIT_B", "declared")
    monkeypatch.delenv("RC_UNIT_C", raising=False)
    runner = ex.RayExecutor(ex.Settings("a:1", 0, 0, "--ray", "--ray-retries", "--ray-copy"), tmp_path)
    node = {"ip": "10.0.0.2", "host": "n2", "node_id": "c" * 56}
    task = ex.Task("t ok auto", ["t[ok-auto-ckpt1]"], {"env": {"RC_UNIT_B": "declared"}}, {}, node=node)
    record = {"name": "t[ok-auto-ckpt1]", "outcome": wire.PASSED, "cell_json": {"rerun": "x"},
              "environ": {"RC_UNIT_A": None, "RC_UNIT_B": environ.digest(runner.env_key, "declared"),
                          "RC_UNIT_C": environ.digest(runner.env_key, "only there")}}
    got = runner._outcome_of(record, task)
    assert got.differs == ["RC_UNIT_A", "RC_UNIT_C"] and got.node == node
    runner._answer(record["name"], got)
    runner._answer("t[ok-auto-ckpt2]", ex.CellOutcome(wire.PASSED, node=node))
    runner._answer("u[g-auto-ckpt1]", ex.CellOutcome(wire.FAILED, "TARGET_ERROR: ...", category="TARGET_ERROR"))
    assert runner.placement() == ("resume-check: 3 cells ran on the Ray cluster at a:1: 2 on node 10.0.0.2 (n2, node "
                                  "id cccccccccccc), 1 without one (refused or lost: each says why); 1 read "
                                  "environment variables that differ there (see the warnings)")


# -- what a node gets, and what the reports say -------------------------------------------------------------

def test_a_node_gets_the_declared_variables_as_this_machine_has_them():
    target = resume_target(train, steps=2, pass_env=["RC_MODE"])
    here = {"RC_MODE": "fast", "RC_SECRET": "x"}
    env = environment.for_node(target, settings("RC_OFF"), here)
    assert env == {"RC_MODE": "fast", "RC_OFF": None}
    node = {"RC_MODE": "slow", "RC_OFF": "on", "PATH": "/bin", "PYTEST_ADDOPTS": "-x"}
    got = group_environment({"env": env, "env_key": KEY}, node, {wire.GROUP_ENV: "g"})
    assert got == {"RC_MODE": "fast", "PATH": "/bin", wire.GROUP_ENV: "g", wire.ENV_KEY_ENV: KEY}


def test_a_command_targets_env_counts_as_declared_and_is_not_forwarded():
    target = resume_target(train, steps=2, pass_env=["RC_MODE"]).with_options(
        command=CommandSpec(("prog",), env=(("RC_FIXED", "1"),)))
    assert environment.declared(target, settings("RC_OPT")) == ["RC_FIXED", "RC_MODE", "RC_OPT"]
    assert environment.for_node(target, settings(), {"RC_FIXED": "other"}) == {"RC_MODE": None}
    cell_json = {"environment": {"read": ["RC_FIXED", "RC_MODE", "RC_READ"], "harness": ["PYTEST_RESUME_CHECK_RUN"]}}
    environment.annotate(cell_json, target, settings(), differs=["RC_READ"])
    assert cell_json["environment"]["declared"] == ["RC_FIXED", "RC_MODE"]
    assert cell_json["environment"]["differs"] == ["RC_READ"]
    env = environment.for_repro(target, settings(), cell_json, {"RC_MODE": "fast lane", "RC_READ": "secret"})
    assert env == repro.Environment(passed={"RC_MODE": "fast lane"}, set_by_target={"RC_FIXED": "1"},
                                    read=["RC_READ"], harness=["PYTEST_RESUME_CHECK_RUN"])


def test_the_warning_names_the_variables_and_the_option_that_forwards_them():
    text = environment.differs_message(["TRAINER_MODE", "DATA_ROOT"])
    assert "DATA_ROOT, TRAINER_MODE" in text and f"{OPT_ENV}=DATA_ROOT,TRAINER_MODE" in text
    assert "pass_env=" in text and "\n" not in text
    assert issubclass(environment.EnvironmentDiffersWarning, pytest.PytestWarning)


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

    assert environment_json(Result()) == {"read": ["A", "B", "C"], "harness": ["MY_SERVER", "PYTEST_RESUME_CHECK_RUN"],
                                        "ran_fresh": []}


def test_a_reproduction_says_how_to_set_the_declared_variables_and_names_the_others():
    env = repro.Environment(passed={"RC_MODE": "fast lane", "RC_OFF": None}, set_by_target={"RC_FIXED": "1"},
                            read=["RC_READ"], harness=["PYTEST_RESUME_CHECK_RUN"])
    text = repro.readme_text(repro.Repro(name="t[ok-auto-ckpt1]", target="t", headline="LOST 1 input", excerpt=[],
                                         command="pytest x", report="LOST 1 input", environment=env))
    section = text[text.index(repro.ENV_TITLE):text.index(repro.FILES_TITLE)]
    assert "```bash\nexport RC_MODE='fast lane'\nunset RC_OFF\n```" in section
    assert "`RC_FIXED=1`" in section and "`RC_READ`" in section and "`PYTEST_RESUME_CHECK_RUN`" in section
    assert section.index("export") < section.index("RC_READ")
    empty = "\n".join(repro.environment_lines(repro.Environment()))
    assert repro.ENV_NONE in empty and "bash" not in empty


# -- the option ---------------------------------------------------------------------------------------------

class Config:
    """What reading ``--resume-matrix-env`` asks of pytest's config."""

    def __init__(self, given, ini=""):
        self.given, self.ini = given, ini

    def getoption(self, name):
        return self.given

    def getini(self, name):
        return self.ini


def test_the_option_wins_over_the_ini_and_a_bad_name_is_one_usage_error():
    from pytest_resume_check.plugin.settings import _env

    assert _env(Config(["A,B", "C"], "D")) == ("A", "B", "C")
    assert _env(Config([], "D E,F")) == ("D", "E", "F")
    with pytest.raises(pytest.UsageError, match=r"--resume-matrix-env='A,B-C': 'B-C' is not the name of an environ"):
        _env(Config(["A,B-C"]))
    with pytest.raises(pytest.UsageError, match="ini resume_matrix_env='9X'"):
        _env(Config([], "9X"))


def test_only_the_projects_own_code_is_noted(tmp_path):
    from pytest_resume_check.child import environ as reads

    noted = reads.Reads()
    noted._outside = reads.library_folders()
    (tmp_path / "train.py").write_text("")
    assert noted._is_project(str(tmp_path / "train.py"))
    for library in (os.__file__, reads.__file__, ex.__file__, "/opt/env/lib/python3.11/site-packages/torch/a.py",
                    "/usr/lib/python3/dist-packages/ray/b.py", "<string>", "<frozen os>"):
        assert not noted._is_project(library), library
