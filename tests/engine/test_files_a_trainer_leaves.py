"""What a trainer leaves on disk never stops the harness nor makes it read outside the run: a FIFO beside the
checkpoints is made anew in a shared first run's snapshots (it used to hang the session: the snapshot read it),
a socket there makes the cells killed at that checkpoint run their own first runs; a declared output that is a
FIFO, a link to a device or a link out of the run's folder is the run's ``PROTOCOL`` finding naming it (a FIFO
or ``/dev/zero`` used to be a ``HUNG`` blamed on the program, a link out was read), and a link inside the folder
is followed. The program is tests/support/zero_change_program.py (stdlib only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_resume_check.categories import PROTOCOL, STATE_DIVERGED
from pytest_resume_check.cells.matrix import QUICK, Cell, cells
from pytest_resume_check.child.command import MSG_OUTPUT_REFUSED
from pytest_resume_check.engine import Engine
from pytest_resume_check.records import regular_files as rf
from pytest_resume_check.run import KillSpec
from pytest_resume_check.targets import resume_target

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "zero_change_program.py"
STEPS = 6


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("files_left"), seed=3, hang_timeout=20)
    yield eng
    eng.close()


def program(*flags: str, name: str):
    return resume_target.command(["{python}", str(PROGRAM), "{checkpoint_dir}", *flags], name=name, steps=STEPS,
                                 checkpoints="step_*.json", outputs=["model.json"])


@pytest.mark.parametrize("left", ["fifo", "socket"])
def test_a_fifo_or_a_socket_beside_the_checkpoints_never_stops_the_shared_first_run(engine, left):
    target = program("--leave", left, name=f"leaves_{left}")
    shared = [c for c in cells(target, QUICK, 3) if c.shares_prefix][:2]
    assert len(shared) == 2
    engine.register(shared)
    results = [engine.run_cell(c) for c in shared]
    assert all(r.passed for r in results), [r.verdict.headline for r in results]
    first_runs = {r.runs[0].pid for r in results}
    # A FIFO is made anew in each snapshot: both cells share one first run. A socket cannot be: each cell's
    # first run is its own, killed for real.
    assert len(first_runs) == (1 if left == "fifo" else 2)


@pytest.mark.parametrize("how, kind", [
    ("outside", None),  # first: read through the link before, it passed
    ("fifo", rf.KIND_FIFO),
    ("device", rf.KIND_LINK_OUT.format(target="/dev/zero", folder="{folder}")),
])
def test_an_output_that_is_no_regular_file_of_the_run_is_protocol_naming_it(engine, how, kind):
    result = engine.run_cell(Cell(program("--deliver", how, name=f"delivers_{how}"), {}, "auto", (KillSpec(3),),
                                  STEPS))
    assert result.verdict.categories == [PROTOCOL], result.verdict.headline
    folder = result.reference.plan.checkpoint_dir
    if kind is None:
        outside = str(Path(folder).parent / "model.json")
        kind = rf.KIND_LINK_OUT.format(target=outside, folder=folder)
    assert result.verdict.headline == "PROTOCOL: the reference run " + MSG_OUTPUT_REFUSED.format(
        name="model.json", kind=kind.replace("{folder}", folder))


def test_an_output_linking_inside_the_run_is_compared_through_the_link(engine):
    passing = engine.run_cell(Cell(program("--deliver", "link", name="delivers_link"), {}, "auto", (KillSpec(3),),
                                   STEPS))
    assert passing.passed, passing.verdict.headline
    failing = engine.run_cell(Cell(program("--deliver", "link", "--unsaved-momentum", name="link_unsaved"), {},
                                   "auto", (KillSpec(3),), STEPS))
    assert failing.verdict.categories == [STATE_DIVERGED]
    assert "model.json differs" in failing.verdict.headline
