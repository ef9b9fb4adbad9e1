"""A shared first run's snapshots hold the run's files as links where they can, never as a changed copy:
a file the run rewrites in place after a snapshot linked it, or a file one cell's runs rewrite in place
while a later snapshot still shares it, makes the snapshots holding it unusable, and their cells run their
own first runs: every verdict is the one a copy per snapshot gave (all pass here; a snapshot silently
changed would lose an input). Real processes, torch-free targets (tests/support/snapshot_targets.py)."""

from __future__ import annotations

import pytest
import snapshot_targets as st

from pytest_resume_check.cells.matrix import QUICK, cells
from pytest_resume_check.cells.snapshots import KIND_REWRITTEN, KIND_REWRITTEN_BY_CELL
from pytest_resume_check.engine import Engine
from pytest_resume_check.targets import resume_target

in_place_saver = resume_target(steps=st.STEPS, name="in_place_saver", crash_save=False)(st.in_place_saver)
resume_marker = resume_target(steps=st.STEPS, name="resume_marker", crash_save=False)(st.resume_marker)


@pytest.fixture
def engine(tmp_path):
    eng = Engine(tmp_path / "session", seed=3, hang_timeout=30)
    yield eng
    eng.close()


def _shared_auto_cells(target):
    found = [c for c in cells(target, QUICK, 3) if c.shares_prefix and c.resume_mode == "auto" and len(c.kills) == 1]
    return sorted(found, key=lambda c: c.kills[0].checkpoint_step)


def test_a_file_the_run_rewrites_in_place_after_a_snapshot_never_reaches_that_snapshots_cell(engine):
    shared = _shared_auto_cells(in_place_saver)
    assert len(shared) >= 3
    engine.register(shared)
    results = [engine.run_cell(c) for c in shared]
    assert all(r.passed for r in results), [r.verdict.headline for r in results]
    prefix = engine.shared._prefixes[shared[0].group]
    first = shared[0].kills[0].checkpoint_step
    # The first snapshot linked model.bin, which the run rewrote at its next checkpoint: that cell ran its own
    # first run; the file was copied from then on, so the later cells shared the group's run.
    assert prefix.unshared[first].kind == KIND_REWRITTEN and prefix.unshared[first].rel == st.MODEL
    pids = [r.runs[0].pid for r in results]
    assert pids[0] not in pids[1:] and len(set(pids[1:])) == 1


def test_a_file_a_cells_resume_rewrites_in_place_is_not_what_a_later_snapshot_holds(engine):
    shared = _shared_auto_cells(resume_marker)
    assert len(shared) >= 3
    engine.register(shared)
    results = [engine.run_cell(c) for c in shared]
    assert all(r.passed for r in results), [r.verdict.headline for r in results]
    prefix = engine.shared._prefixes[shared[0].group]
    # config.bin is one file in every snapshot: lent to the first cell, whose resume rewrote it; the later
    # snapshots holding it were not used, and their cells ran first runs of their own.
    later = [c.kills[0].checkpoint_step for c in shared[1:]]
    first = shared[0].kills[0].checkpoint_step
    assert {s: (e.rel, e.kind) for s, e in prefix.unshared.items()} == {
        s: (st.CONFIG, KIND_REWRITTEN_BY_CELL.format(step=first)) for s in later}
    pids = [r.runs[0].pid for r in results]
    assert len(set(pids)) == len(pids)
