"""State a run reports that the harness cannot digest the same way in every run, with real child runs: a plain
object is the run's ``PROTOCOL`` line naming its key path, its type and the fix (its repr, address included, made
the two reference runs differ: a false ``NONDETERMINISTIC`` with seeding advice), and a sparse tensor is digested
by its own components (digesting it raised in the child: a ``CRASHED`` blamed on the trainer)."""

from __future__ import annotations

import plain_state_target as plain
import pytest

from pytest_resume_check.cells.matrix import Cell
from pytest_resume_check.engine import Engine
from pytest_resume_check.judge import verdict as vd
from pytest_resume_check.records.plan import KillSpec
from pytest_resume_check.records.state import MSG_UNDIGESTABLE, WHY_ADDRESS
from pytest_resume_check.targets import resume_target

TARGET = resume_target(plain.train, name="plain_undigestable", steps=plain.STEPS)
#: The sparse cases import torch in the run: the fork server imports it once.
SPARSE = resume_target(plain.train, name="plain_sparse", steps=plain.STEPS, preload=("torch",))
TOLERANT = resume_target(plain.train, name="plain_undigestable_tol", steps=plain.STEPS, state_tolerance=(1e-6, 0.0))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(tmp_path_factory.mktemp("undigestable"), seed=3, hang_timeout=30)


def judge(engine, target, case):
    return engine.run_cell(Cell(target, case, "auto", (KillSpec(2),), plain.STEPS)).verdict


@pytest.mark.parametrize("target", [TARGET, TOLERANT], ids=["exact", "tolerance"])
def test_a_plain_object_in_the_state_is_a_protocol_line_naming_it_not_nondeterministic(engine, target):
    verdict = judge(engine, target, {"object": "state"})
    assert verdict.categories == [vd.PROTOCOL]
    assert verdict.headline == vd.MSG_CALLS.format(who="the reference run", what=MSG_UNDIGESTABLE.format(
        where="state['opt']['sched']", call="run.state(step=1)", type="plain_state_target.Schedule", why=WHY_ADDRESS))


def test_a_plain_object_in_the_final_outputs_is_a_protocol_line_naming_it(engine):
    verdict = judge(engine, TARGET, {"object": "final"})
    assert verdict.categories == [vd.PROTOCOL]
    assert verdict.headline == vd.MSG_CALLS.format(who="the reference run", what=MSG_UNDIGESTABLE.format(
        where="final['best']", call="run.final()", type="plain_state_target.Schedule", why=WHY_ADDRESS))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_tensor_in_the_state_is_digested_and_judged(engine, layout):
    pytest.importorskip("torch")
    assert judge(engine, SPARSE, {"sparse": layout}).passed
    verdict = judge(engine, SPARSE, {"sparse": layout, "sparse_nudge": True})
    assert verdict.categories == [vd.STATE_DIVERGED]
    assert "model differs (sparse)" in verdict.headline
