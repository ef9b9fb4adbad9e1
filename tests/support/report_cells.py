"""Cell JSON built by hand, as ``report.cell_json`` gives it, for the tests of the reports: a passing, a lost, a
duplicated and a state-diverged cell, one cell per status and category of ``categories.TABLE``, the cells of a
crash-consistency save, a two-rank cell, a 1,200-cell matrix; and the timelines a page embeds, decoded."""

from __future__ import annotations

import json
import re

from pytest_resume_check import categories
from pytest_resume_check.judge import verdict
from pytest_resume_check.records import kill_ids
from pytest_resume_check.records.faults import ERRNOS, MODE_CRASH, MODE_ERROR, MODE_POWER, MODE_TORN, FaultPlan
from pytest_resume_check.records.plan import KillSpec

#: An id, a target name and a headline that would break out of the page if anything went in unescaped.
PAYLOAD = '</script><img src=x onerror="alert(1)">&amp; <b>'
#: The story every hand-built cell tells.
STORY = "run 1: killed right after checkpoint of step 1 was published -> run 2 (resume from step 1): done"


def ledger(steps, take=2, n=8, run_of=lambda step: 0):
    """``[id, step, epoch, run]`` rows of a loop taking ``take`` of ``n`` inputs per step, in order."""
    rows = []
    for i in range(steps * take):
        step = i // take + 1
        rows.append([i % n, step, i // n, run_of(step)])
    return rows


def cell(target="t", case="c", mode="auto", kill=None, passed=True, categories=(), headline="PASSED",
         reference=None, composite=None, resumed_from=(), xfail_reason=None, **extra):
    """A cell's JSON as ``report.cell_json`` gives it; ``kill`` is a KillSpec or a tuple of them."""
    kill = KillSpec(1) if kill is None else kill
    kills = (kill,) if isinstance(kill, KillSpec) else tuple(kill)
    reference, composite = reference or [], composite or []
    ref_marks, comp_marks = verdict.entry_marks(reference, composite)
    runs = [{"outcome": "killed", "exitcode": -9, "seconds": 0.1}, {"outcome": "done", "exitcode": 0, "seconds": 0.2}]
    data = {"target": target, "case": {"id": case}, "case_id": case, "resume_mode": mode,
            "kill": kill_ids.kill_id(kills), "kills": [k.to_json() for k in kills], "passed": passed,
            "xfail_reason": xfail_reason, "categories": list(categories), "headline": headline,
            "resumed_from": list(resumed_from), "reference": reference, "composite": composite,
            "marks": {"reference": ref_marks, "composite": comp_marks}, "story": STORY, "runs": runs, **extra}
    data.setdefault("status", globals()["categories"].status(data))
    return data


def lost_cell(headline="LOST 2 inputs after resume from step_1: ids 2, 3", **kw):
    """Killed after checkpoint 1; the resumed run skips ids 2 and 3 (a buffered tail not saved)."""
    ref = ledger(4)
    comp = [r for r in ref if r[1] == 1] + [[i, s, 0, 1] for i, s in ((4, 2), (5, 2), (6, 3), (7, 3))]
    return cell(passed=False, categories=["LOST"], headline=headline, reference=ref, composite=comp,
                resumed_from=[1], **kw)


def duplicated_cell(**kw):
    """Killed after checkpoint 1; the resumed run takes ids 0 and 1 again."""
    ref = ledger(4)
    comp = [r for r in ref if r[1] == 1] + [[i, s + 1, 0, 1] for i, s in ((0, 1), (1, 1), (2, 2), (3, 2))]
    return cell(passed=False, categories=["DUPLICATED"], headline="DUPLICATED 2 inputs: ids 0, 1",
                reference=ref, composite=comp, resumed_from=[1], **kw)


STATE_HEADLINE = "STATE_DIVERGED at step 3 (2 steps after resume from step_1): optimizer differs (state.0.exp_avg)"


def state_cell(**kw):
    """Killed after checkpoint 1; the inputs agree, the optimizer's state differs from step 3."""
    ref = ledger(4)
    comp = [r for r in ref if r[1] == 1] + [[i, s, e, 1] for i, s, e, _ in ref if s > 1]
    return cell(passed=False, categories=["STATE_DIVERGED"], headline=STATE_HEADLINE, reference=ref, composite=comp,
                resumed_from=[1], state_diverged=3,
                findings=[{"category": "STATE_DIVERGED", "headline": STATE_HEADLINE, "step": 3}], **kw)


def every_status_cells(target="t"):
    """One cell per row of ``categories.TABLE``, in table order (kill point i for row i)."""
    cells = []
    for i, c in enumerate(categories.TABLE, start=1):
        kw = {"target": target, "kill": KillSpec(i)}
        if c.name == categories.PASSED:
            cells.append(cell(**kw))
        elif c.name == categories.XFAIL:
            cells.append(lost_cell(xfail_reason="known", **kw))
        elif c.name == categories.XPASS:
            cells.append(cell(xfail_reason="was known", **kw))
        elif c.name == categories.LOST:
            cells.append(lost_cell(**kw))
        elif c.name == categories.DUPLICATED:
            cells.append(duplicated_cell(**kw))
        elif c.name == categories.STATE_DIVERGED:
            cells.append(state_cell(**kw))
        else:
            cells.append(cell(passed=False, categories=[c.name], headline=f"{c.name}: planted", **kw))
    assert [categories.status(c) for c in cells] == [c.name for c in categories.TABLE]
    return cells


def crash_cell(mode, op, errno=None, persistent=False, file=None, **kw):
    """A crash-consistency cell: a fault at file operation ``op`` of the save of step 3 (5 ops)."""
    return cell(kill=KillSpec(3, 0, FaultPlan(3, mode, op, errno, persistent, file, total=5)), **kw)


def crash_matrix():
    """Plain kill points 1-4 and the crash-consistency cells of one save, two of which fail."""
    cells = [cell(kill=KillSpec(k)) for k in range(1, 5)]
    cells += [crash_cell(MODE_CRASH, op) for op in range(6)] + [crash_cell(MODE_POWER, op) for op in (0, 5)]
    cells += [crash_cell(MODE_POWER, 2, passed=False, categories=["STALE_RESUME"], headline="STALE_RESUME: planted")]
    cells += [crash_cell(MODE_TORN, 4, file="model.pt")]
    cells += [crash_cell(MODE_ERROR, op, ERRNOS["enospc"]) for op in range(5)]
    cells += [crash_cell(MODE_ERROR, 2, ERRNOS["eio"], passed=False, categories=["SILENT_IO_ERROR"],
                         headline="SILENT_IO_ERROR: planted")]
    cells += [crash_cell(MODE_ERROR, 1, ERRNOS["enospc"], True)]
    return cells


def synthetic_matrix(n_cells=1200, failing_every=4, steps=60):
    """A large matrix: 3 targets x 4 cases x 2 resume modes x 50 kill points; every 4th cell fails."""
    cells = []
    points = [(KillSpec(k),) for k in range(1, 46)] + [(KillSpec(k, 1),) for k in range(0, 4)]
    points.append((KillSpec(1), KillSpec(40, 1)))
    for t in range(3):
        for c in range(4):
            for mode in ("auto", "path"):
                for kills in points:
                    index = len(cells)
                    if index % failing_every:
                        cells.append(cell(f"target{t}", f"case{c}", mode, kills))
                        continue
                    ref = ledger(steps, take=4, n=40)
                    at = max(1, kills[0].checkpoint_step)  # the checkpoint resumed from
                    comp = [r for r in ref if r[1] <= at] + [[r[0], r[1], r[2], 1] for r in ref if r[1] > at + 1]
                    name = f"target{t}[case{c}-{mode}-{kill_ids.kill_id(kills)}]"
                    cells.append(cell(f"target{t}", f"case{c}", mode, kills, passed=False, categories=["LOST"],
                                      headline=f"LOST 4 inputs after resume from step_{at}",
                                      reference=ref, composite=comp, resumed_from=[at],
                                      rerun=f"pytest --resume-matrix-cell={name}"))
    assert len(cells) == n_cells
    return cells


def embedded_timelines(page):
    """The JSON the page's script draws from, decoded."""
    match = re.search(r'<script type="application/json" id="timelines">(.*?)</script>', page, re.S)
    assert match, "no embedded timeline data"
    return json.loads(match.group(1))


def two_rank_cell():
    """A two-rank cell killed after checkpoint 1 whose resumed rank 1 takes rank 0's inputs (rows carry the
    rank as a fifth item, as ``Ledger.to_json`` writes them for multi-rank runs)."""
    ref = [[2 * (s - 1) + r, s, 0, 0, r] for s in (1, 2, 3) for r in (0, 1)]
    comp = [row for row in ref if row[1] == 1] + [[2 * (s - 1), s, 0, 1, r] for s in (2, 3) for r in (0, 1)]
    return cell(passed=False, categories=["LOST", "DUPLICATED"], headline="LOST 2 inputs on rank 1 after resume",
                reference=ref, composite=comp, resumed_from=[1])
