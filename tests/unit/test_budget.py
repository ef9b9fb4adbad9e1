"""``--resume-matrix-budget``: the order of the cells by what they reveal and the cut at a
number of runs (no processes, no torch)."""

from __future__ import annotations

from pytest_resume_check.cells import budget, matrix
from pytest_resume_check.records import faults
from pytest_resume_check.records.plan import KillSpec


def some_target(run):  # module level: targets must be importable by name
    pass


def make(**kw):
    from pytest_resume_check.targets import resume_target

    kw.setdefault("steps", 40)
    kw.setdefault("boundaries", lambda case: [20, 40])
    return resume_target(some_target, **kw)


def quick(target):
    return matrix.cells(target, matrix.QUICK, seed=3)


def test_the_cut_stays_within_the_budget_and_keeps_the_matrix_order():
    cells = quick(make(cases=[{"id": "a"}, {"id": "b"}]))
    for runs in (1, 5, 12, 30):
        cut = budget.cut(cells, runs)
        assert cut.runs <= runs
        assert cut.total_runs > 30
        assert sorted(map(id, cut.kept + cut.left_out)) == sorted(map(id, cells))
        assert cut.kept == [c for c in cells if c in cut.kept]  # matrix order, not the ranking's
    assert budget.cut(cells, 1).kept == []  # no cell costs a single run: a first run, a resume, a reference


def test_a_budget_as_large_as_the_matrix_keeps_every_cell_and_counts_its_runs():
    cells = quick(make(cases=[{"id": "a"}]))
    whole = budget.cut(cells, 10_000)
    assert whole.left_out == [] and whole.runs == whole.total_runs
    assert budget.cut(cells, whole.total_runs).left_out == []
    assert budget.cut(cells, whole.total_runs - 1).left_out != []


def test_each_case_and_resume_mode_and_an_epoch_boundary_come_before_any_second_middle_step():
    cells = quick(make(cases=[{"id": "a"}, {"id": "b"}]))
    ordered = [c for _, c in budget.order(cells)]
    head = ordered[:4]
    assert {(c.case_id, c.resume_mode) for c in head} == {("a", "auto"), ("a", "path"), ("b", "auto"), ("b", "path")}
    first_boundary = next(i for i, c in enumerate(ordered) if ("boundary", "some_target", c.case_id)
                          in budget.features(c))
    middle = [i for i, c in enumerate(ordered) if budget.features(c) <= {
        f for f in budget.features(c) if f[0] in ("mode", "step")}]
    assert first_boundary < 8 and middle and min(middle) > first_boundary


def test_shared_first_runs_and_references_are_paid_once():
    cells = quick(make(cases=[{"id": "a"}]))
    singles = [c for c in cells if c.shares_prefix and c.resume_mode == "auto"]
    assert len(singles) >= 3
    # one reference, one shared first run, then one resumed run per cell
    assert budget.cut(singles, 10_000).total_runs == 2 + len(singles)


def test_what_a_cell_reveals_names_its_kind_of_kill():
    target = make(cases=[{"id": "a"}], buffered=lambda case: [7])
    cell = matrix.Cell(target, {"id": "a"}, "auto", (KillSpec(1), KillSpec(7, 2)), 40)
    kinds = {f[0] for f in budget.features(cell)}
    assert {"mode", "first", "buffered", "unsaved", "double", "step"} <= kinds
    assert not kinds & {"boundary", "last", "crash", "rank", "term"}
    fault = faults.FaultPlan(2, faults.MODE_CRASH, 4)
    crash = matrix.Cell(target, {"id": "a"}, "auto", (KillSpec(2, fault=fault),), 40)
    assert ("crash", "some_target") in budget.features(crash)
    assert set(budget.WEIGHTS) >= {f[0] for f in budget.features(cell) | budget.features(crash)}
