"""A command's ``state`` and ``final`` lines may carry leaves the program digested itself:
the child then reports exactly the event a Python target's ``RunContext`` makes for the same values, so the
headline names the same first differing leaf; a malformed ``leaves`` field is refused, naming the format.
No processes: the calls are answered by a ``RunContext`` whose events are collected."""

from __future__ import annotations

import pytest

from pytest_resume_check.child import command
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.records.state import leaf_digests
from pytest_resume_check.run import RunContext

#: An optimizer's state as plain values (a Python target would give the optimizer itself; its state_dict is this).
OPTIMIZER = {"state": {0: {"momentum_buffer": [0.5, -0.25]}}, "param_groups": [{"lr": 0.1, "momentum": 0.9}]}
MODEL = {"weight": [[1.0, 2.0]], "bias": [0.0]}


class Sink:
    def __init__(self):
        self.events = []

    def send(self, event):
        self.events.append(event)


def context(tmp_path, **plan):
    sink = Sink()
    options = {"report_state": True, **plan}
    return RunContext(RunPlan("t", ("", "", ""), {}, 0, str(tmp_path), str(tmp_path / "run0.log"), **options),
                      sink), sink


def state_events(sink):
    return [e for e in sink.events if e.kind in (ev.STATE, ev.FINAL)]


@pytest.mark.parametrize("call", ["state", "final"])
def test_leaves_digested_by_the_program_report_what_a_python_target_reports(tmp_path, call):
    components = {"model": MODEL, "optimizer": OPTIMIZER}
    python, python_sink = context(tmp_path)
    if call == "state":
        python.state(3, components)
    else:
        python.final(components)
    relayed, relayed_sink = context(tmp_path)
    command._dispatch(relayed, {"call": call, "step": 3,
                                command.FIELD_LEAVES: {k: leaf_digests(v) for k, v in components.items()}})
    assert state_events(relayed_sink) == state_events(python_sink)
    leaves = state_events(relayed_sink)[0].extra[ev.STATE_LEAVES]
    assert "state.0.momentum_buffer.0" in leaves["optimizer"]  # named leaf by leaf, not one opaque digest


def test_a_run_whose_state_nobody_compares_sends_no_leaves(tmp_path):
    run, sink = context(tmp_path, report_state=False)
    command._dispatch(run, {"call": "state", "step": 1, command.FIELD_LEAVES: {"model": leaf_digests(MODEL)}})
    assert state_events(sink) == []


@pytest.mark.parametrize("leaves", [["x"], {"model": "one digest"}, {"model": {"weight": 3}}])
def test_malformed_leaves_are_refused_naming_the_format(tmp_path, leaves):
    run, _ = context(tmp_path)
    with pytest.raises(TypeError, match="leaf paths and their digests"):
        command._dispatch(run, {"call": "state", "step": 1, command.FIELD_LEAVES: leaves})


def test_a_line_with_components_and_leaves_is_refused(tmp_path):
    run, _ = context(tmp_path)
    with pytest.raises(ValueError, match="components or leaves, not both"):
        command._dispatch(run, {"call": "state", "step": 1, "components": {"model": 1},
                                command.FIELD_LEAVES: {"model": leaf_digests(MODEL)}})


def test_leaves_under_a_tolerance_are_refused_with_the_fix(tmp_path):
    run, _ = context(tmp_path, state_tolerance=(1e-5, 1e-8))
    with pytest.raises(ValueError, match="send them as components"):
        command._dispatch(run, {"call": "state", "step": 1, command.FIELD_LEAVES: {"model": leaf_digests(MODEL)}})


# -- the Python client chooses the field itself ----------------------------------------------------------------

def test_the_client_sends_json_values_as_components():
    from pytest_resume_check.client import _state_fields

    assert _state_fields({"model": MODEL, 3: "x"}) == {"components": {"model": MODEL, "3": "x"}}


def test_the_client_digests_what_json_cannot_carry_leaf_by_leaf():
    torch = pytest.importorskip("torch")
    from pytest_resume_check.client import _state_fields

    weights = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([0.0])}
    fields = _state_fields({"model": weights, "step": 3})
    assert fields == {"leaves": {"model": leaf_digests(weights), "step": leaf_digests(3)}}
    assert sorted(fields["leaves"]["model"]) == ["bias", "weight"]  # the leaves keep their names
