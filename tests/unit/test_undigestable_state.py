"""Digests refuse what they cannot digest the same way in every run, naming it, and digest what they can: a plain
object (its repr holds its address) is an :class:`Undigestable` naming its key path, type and the fix, and
``run.state`` turns it into the run's one ``PROTOCOL`` line rather than a digest that differs between equal
runs; values with a deterministic repr (enums, dataclasses, paths, numbers) stay digested; sparse tensors of
every layout are digested by their own components (digesting them raised), a quantized one with its scale.
No processes: the calls are answered by a ``RunContext`` whose events are collected."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import pytest

from pytest_resume_check import client, digest
from pytest_resume_check.child import command
from pytest_resume_check.child.ending import DIGEST_OF_CALL, DIGEST_OF_ROOT, report_end
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import RunPlan
from pytest_resume_check.records.state import (
    MSG_UNDIGESTABLE,
    WHY_ADDRESS,
    WHY_REPR_RAISED,
    Undigestable,
    leaf_digest,
    leaf_digests,
    plain_values,
)
from pytest_resume_check.run import RunContext

#: torch's notes that sparse layouts are in beta and quantized tensors deprecated say nothing here.
pytestmark = pytest.mark.filterwarnings("ignore:.*(Sparse|sparse|quantiz).*:UserWarning")

#: The fix every refusal ends with.
FIX = "give it a state_dict(), or report a number, a tensor, or a dict of them"


class Schedule:
    """A trainer's own object with state and no state_dict(): object's repr, address included."""

    def __init__(self, step):
        self.step = step


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr today")


class Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    name: str = "adam"


class Sink:
    def __init__(self):
        self.events = []

    def send(self, event):
        self.events.append(event)

    def flush(self):
        pass


def context(tmp_path, **plan):
    sink = Sink()
    options = {"report_state": True, **plan}
    return RunContext(RunPlan("t", ("", "", ""), {}, 0, str(tmp_path), str(tmp_path / "run0.log"), **options),
                      sink), sink


def refusal(value):
    with pytest.raises(Undigestable) as caught:
        leaf_digests(value)
    return caught.value


def test_a_plain_object_is_refused_naming_its_key_path_type_and_the_fix():
    exc = refusal({"opt": {"lr": 0.1, "sched": Schedule(3)}})
    assert exc.keys == ("opt", "sched") and exc.type_name == f"{__name__}.Schedule" and exc.why == WHY_ADDRESS
    text = exc.message("state", "run.state(step=3)")
    assert text == MSG_UNDIGESTABLE.format(where="state['opt']['sched']", call="run.state(step=3)",
                                           type=f"{__name__}.Schedule", why=WHY_ADDRESS)
    assert text.endswith(FIX) and "\n" not in text


@pytest.mark.parametrize("value, keys", [
    ([1, lambda: 0], (1,)),  # a function
    ({"rng": {"gen": object()}}, ("rng", "gen")),
    ({"bound": Schedule(1).__init__}, ("bound",)),
], ids=["function", "object", "bound-method"])
def test_objects_whose_repr_names_their_address_are_refused(value, keys):
    assert refusal(value).keys == keys


def test_an_object_whose_repr_raises_is_refused_with_the_error():
    exc = refusal({"x": BadRepr()})
    assert exc.why == WHY_REPR_RAISED.format(error="RuntimeError: no repr today")


def test_a_numpy_object_array_of_plain_objects_is_refused():
    np = pytest.importorskip("numpy")
    assert refusal({"a": np.array([Schedule(1)], dtype=object)}).keys == ("a",)


def test_values_with_a_deterministic_repr_stay_digested_as_before():
    value = {"colour": Colour.RED, "config": Config(), "path": Path("/data"), "n": 3, "x": 0.5, "s": "s", "none": None,
             "b": b"\x00", "t": (1, 2)}
    assert leaf_digests(value) == leaf_digests(dict(value))
    assert leaf_digest(Config(lr=0.2)) != leaf_digest(Config())


def test_plain_values_refuse_what_digests_refuse():
    with pytest.raises(Undigestable) as caught:
        plain_values({"opt": {"sched": Schedule(1)}})
    assert caught.value.keys == ("opt", "sched")


@pytest.mark.parametrize("call", ["state", "final"])
def test_run_state_sends_one_protocol_line_and_no_state_event(tmp_path, call):
    run, sink = context(tmp_path)
    for step in (1, 2):
        if call == "state":
            run.state(step, {"model": {"w": 1.0}, "opt": {"sched": Schedule(step)}})
        else:
            run.final({"model": {"w": 1.0}, "opt": {"sched": Schedule(step)}})
    assert [e.kind for e in sink.events] == [ev.VIOLATION]
    where = "state['opt']['sched']" if call == "state" else "final['opt']['sched']"
    assert sink.events[0].text == MSG_UNDIGESTABLE.format(
        where=where, call="run.state(step=1)" if call == "state" else "run.final()", type=f"{__name__}.Schedule",
        why=WHY_ADDRESS)


def test_under_a_tolerance_run_state_sends_the_same_protocol_line(tmp_path):
    run, sink = context(tmp_path, state_tolerance=(1e-6, 0.0))
    run.state(1, {"opt": {"sched": Schedule(1)}})
    assert [e.kind for e in sink.events] == [ev.VIOLATION]
    assert sink.events[0].text.startswith("reported state['opt']['sched'] to run.state(step=1): a ")


def test_a_command_programs_refused_leaf_is_the_same_protocol_line(tmp_path):
    python, python_sink = context(tmp_path)
    python.state(2, {"opt": {"sched": Schedule(2)}})
    relayed, relayed_sink = context(tmp_path)
    fields = client._state_fields({"opt": {"sched": Schedule(2)}})
    command._dispatch(relayed, {"call": "state", "step": 2, **fields})
    assert fields[command.FIELD_REFUSED]["keys"] == ["opt", "sched"]
    assert [(e.kind, e.text) for e in relayed_sink.events] == [(e.kind, e.text) for e in python_sink.events]


def test_digest_of_in_a_target_ends_the_run_with_its_protocol_line_first(tmp_path):
    sink = Sink()
    plan = RunPlan("t", ("", "", ""), {}, 0, str(tmp_path), str(tmp_path / "run0.log"))
    report_end(plan, sink, lambda: digest.digest_of({"opt": Schedule(1)}))
    assert [e.kind for e in sink.events] == [ev.VIOLATION, ev.ERROR]
    assert sink.events[0].text == MSG_UNDIGESTABLE.format(
        where=f"{DIGEST_OF_ROOT}['opt']", call=DIGEST_OF_CALL, type=f"{__name__}.Schedule", why=WHY_ADDRESS)


# -- tensors ----------------------------------------------------------------------------------------

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def sparse(torch, layout, dense):
    if layout == "coo":
        return dense.to_sparse()
    if layout in ("bsr", "bsc"):
        return getattr(dense, f"to_sparse_{layout}")((1, 1))
    return getattr(dense, f"to_sparse_{layout}")()


LAYOUTS = ["coo", "csr", "csc", "bsr", "bsc"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_sparse_tensor_of_every_layout_is_digested_by_its_values(torch, layout):
    dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    other = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 4.0]])
    assert leaf_digest(sparse(torch, layout, dense)) == leaf_digest(sparse(torch, layout, dense.clone()))
    assert leaf_digest(sparse(torch, layout, dense)) != leaf_digest(sparse(torch, layout, other))
    assert leaf_digest(sparse(torch, layout, dense)) != leaf_digest(dense)
    assert plain_values({"w": sparse(torch, layout, dense)})["w"].tolist() == dense.tolist()


def test_a_coo_tensor_is_coalesced_before_it_is_digested(torch):
    shape = (2, 3)
    ordered = torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0]), shape)
    shuffled = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [2, 2, 0]]), torch.tensor([5.0, 3.0, 4.0]), shape)
    assert leaf_digest(ordered) == leaf_digest(shuffled)


def test_a_quantized_tensor_is_digested_with_its_scale(torch):
    a = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    b = torch.quantize_per_tensor(torch.ones(3) * 2, 0.2, 0, torch.qint8)
    assert a.int_repr().tolist() == b.int_repr().tolist() and leaf_digest(a) != leaf_digest(b)


def test_a_nested_tensor_is_the_tensors_it_holds(torch):
    nested = torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)], layout=torch.jagged)
    assert leaf_digests({"n": nested}) == leaf_digests({"n": [torch.ones(2), torch.zeros(3)]})


def test_a_tensor_with_no_values_to_read_is_refused_naming_its_layout(torch):
    exc = refusal({"w": torch.empty(2, device="meta")})
    assert exc.keys == ("w",) and exc.type_name == "torch.Tensor" and "meta" in exc.why
