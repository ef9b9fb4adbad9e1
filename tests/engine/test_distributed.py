"""Multi-rank targets: the harness launches the ranks, kills all of them, one of them, or
preempts them with SIGTERM and a grace period, resumes at another world size, and judges the global
ledger and each rank's. The bundled two-rank DDP loop (gloo, StatefulDistributedSampler, DCP) passes;
each planted bug fails with its category and names the rank.

Real processes, real gloo rendezvous on loopback, real SIGKILL and SIGTERM.
"""

from __future__ import annotations

import re
import socket

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import distributed_targets as planted  # noqa: E402

from pytest_resume_check.builtin import ddp  # noqa: E402
from pytest_resume_check.builtin.targets import builtin_loop, ddp_loop  # noqa: E402
from pytest_resume_check.cells import matrix  # noqa: E402
from pytest_resume_check.cells.matrix import Cell  # noqa: E402
from pytest_resume_check.engine import Engine  # noqa: E402
from pytest_resume_check.judge import verdict as vd  # noqa: E402
from pytest_resume_check.records import kill_ids
from pytest_resume_check.report import text as rp  # noqa: E402
from pytest_resume_check.targets import resume_target  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("ddp"), seed=5, hang_timeout=60)
    yield eng
    eng.close()


def run(engine, target, kill_id, case=None):
    case = case if case is not None else target.cases[0]
    cell = Cell(target, case, "auto", kill_ids.parse_kill_id(kill_id), int(target.steps(case)))
    return engine.run_cell(cell)


def planted_target(fn, **kw):
    return ddp_loop.with_options(name=fn.__name__, fn=fn, **kw)


def listening(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("kill", ["ckpt4", "ckpt6:rank1", "ckpt5+1:term2", "ckpt9:ws1", "ckpt3:ws3"])
def test_the_correct_two_rank_loop_passes_each_kind_of_kill(engine, kill):
    result = run(engine, ddp_loop, kill)
    assert result.verdict.findings == []
    first, resumed = result.runs[0], result.runs[1]
    assert first.plan.world_size == 2
    assert resumed.plan.world_size == {"ckpt9:ws1": 1, "ckpt3:ws3": 3}.get(kill, 2)
    # Both ranks took inputs and the global ledger holds each input once per epoch.
    rows = rp.cell_json(result)["composite"]
    assert {row[4] for row in rows} >= {0, 1}
    for epoch in range(ddp.EPOCHS):
        assert sorted(row[0] for row in rows if row[2] == epoch) == list(range(ddp.N_INPUTS))
    for rec in result.runs:  # nothing of the run is left: its rendezvous port is closed again
        assert rec.leftovers == 0
        assert not listening(rec.plan.master_port)


@pytest.mark.parametrize("kill", ["ckpt4", "ckpt5+1"])
def test_every_rank_is_killed_once_the_others_are_past_the_kill_point(engine, kill):
    """Rank 1 reported the step's end (or published the checkpoint) before the SIGKILL came: in this loop it
    was then inside the next all-reduce, waiting for rank 0."""
    result = run(engine, ddp_loop, kill)
    assert result.verdict.findings == []
    first = result.runs[0]
    assert first.signalled.text == "SIGKILL" and first.signalled.extra["ranks_past"] == [1]
    kill_at = first.events.index(first.signalled)
    reported = [e for e in first.events[:kill_at] if e.rank == 1 and e.kind in ("step_end", "checkpoint")]
    assert reported[-1].step == (4 if kill == "ckpt4" else 6)


def test_one_rank_killed_alone_is_torn_down_by_the_launcher(engine):
    result = run(engine, ddp_loop, "ckpt6+1:rank1")
    assert result.verdict.findings == []
    first = result.runs[0]
    signalled = first.signalled
    assert signalled.extra["rank"] == 1 and signalled.text == "SIGKILL"
    assert first.teardown.startswith("the launcher ended the other ranks")
    assert first.exitcode == 71  # the launcher's "a rank died" exit


def test_preemption_saves_within_the_grace_period_and_resumes_from_it(engine):
    result = run(engine, ddp_loop, "ckpt5+1:term2")
    first, resumed = result.runs[0], result.runs[1]
    ranks = next(e.extra["pids"] for e in first.events if e.kind == "ranks")
    assert first.signalled.extra == {"signal": "term", "grace": 2.0, "pids": ranks}  # each rank, not the launcher
    assert first.published[-1][0] == 6  # saved on SIGTERM at the end of step 6
    assert resumed.resumed_step == 6


def test_resume_from_one_rank_onto_two(engine):
    target = ddp_loop.with_options(name="ddp_one_rank", fn=planted.ddp_one_rank, world_size=1, elastic=(2,),
                                   steps=lambda case: ddp.total_steps(1))
    result = run(engine, target, "ckpt6:ws2")
    assert result.verdict.findings == []
    assert [r.plan.world_size for r in result.runs] == [1, 2]


def test_sampler_saved_from_rank0_only_names_rank_1(engine):
    result = run(engine, planted_target(planted.ddp_sampler_rank0), "ckpt3")
    assert result.verdict.categories[:2] == [vd.LOST, vd.DUPLICATED]
    lost, dup = result.verdict.findings[:2]
    # After the resume rank 1 takes rank 0's shard: its own inputs are lost, rank 0's taken twice.
    assert re.match(r"LOST \d+ inputs on rank 1 after resume from step_3: ", lost.headline)
    assert re.match(r"DUPLICATED \d+ inputs on rank 1 after resume from step_3: ", dup.headline)


def test_one_rank_resuming_from_an_older_checkpoint_is_stale(engine):
    result = run(engine, planted_target(planted.ddp_stale_rank), "ckpt1_ckpt4")
    assert result.verdict.categories[0] == vd.STALE_RESUME
    assert result.verdict.headline.startswith(
        "STALE_RESUME: rank 1 of run 3 resumed from step_1 (step 1) but rank 0 resumed from step_4 (step 4)")


def test_epoch_not_set_after_an_elastic_resume_loses_and_repeats_inputs(engine):
    result = run(engine, planted_target(planted.ddp_elastic_epoch), "ckpt9:ws1")
    assert vd.LOST in result.verdict.categories and vd.DUPLICATED in result.verdict.categories
    assert "(epoch 1)" in result.verdict.headline
    # The same bug is invisible where the resumed world size equals the saved one.
    assert run(engine, planted_target(planted.ddp_elastic_epoch), "ckpt9").verdict.findings == []


def test_a_handler_that_swallows_sigterm_is_stale_and_says_so(engine):
    result = run(engine, planted_target(planted.ddp_term_ignored), "ckpt5+1:term2")
    assert result.verdict.categories == [vd.STALE_RESUME]
    assert result.verdict.headline.startswith(
        "STALE_RESUME: run 1 got SIGTERM at the end of step 6 and published no checkpoint: it ignored the signal "
        "and trained")
    assert "within its 2 s grace period; run 2 resumed from step_5 (step 5): 1 step of training lost" in \
        result.verdict.headline


def test_a_trainer_without_a_sigterm_handler_dies_without_saving(engine):
    target = builtin_loop.with_options(name="loop_preempted", preemption=(1.0,), crash_save=None)
    case = {"id": "take4", "take": 4}
    result = run(engine, target, "ckpt2+1:term1", case)
    assert result.verdict.categories == [vd.STALE_RESUME]
    assert "published no checkpoint: it died of the signal without saving within its 1 s grace" in \
        result.verdict.headline
    assert result.runs[0].exitcode == -15


def test_kill_ids_of_the_distributed_kinds_round_trip():
    for text in ("ckpt6:rank1", "ckpt5+1:term2", "ckpt3:ws3", "ckpt5+1:term2.5:ws1", "ckpt1_ckpt4+1:rank1:ws1"):
        assert kill_ids.kill_id(kill_ids.parse_kill_id(text)) == text
    with pytest.raises(ValueError, match="unknown suffix 'sigint' .*use :term<grace seconds>, :rank<rank>"):
        kill_ids.parse_kill_id("ckpt3:sigint")
    with pytest.raises(ValueError, match=":term and :rank cannot be combined"):
        kill_ids.parse_kill_id("ckpt3+1:term2:rank1")
    assert not Cell(ddp_loop, {}, "auto", kill_ids.parse_kill_id("ckpt3:ws1"), 12).shares_prefix
    assert Cell(ddp_loop, {}, "auto", kill_ids.parse_kill_id("ckpt3"), 12).shares_prefix


def test_the_bundled_matrix_has_every_distributed_kind():
    ids = [c.kill_id for c in matrix.cells(ddp_loop, "quick", 0)]
    assert {"ckpt6:rank1", "ckpt6+1:rank1", "ckpt5+1:term2", "ckpt9:ws1", "ckpt3:ws3", "ckpt3+1:ws1"} <= set(ids)
    assert len(ids) == len(set(ids)) + 5  # the path-mode cells repeat five auto kill ids


@pytest.mark.parametrize("options, message", [
    ({"world_size": 0}, "world_size=0 must be a whole number of ranks from 1 to 32"),
    ({"world_size": 1000}, "world_size=1000 must be a whole number of ranks from 1 to 32"),
    ({"world_size": 2, "elastic": [64]}, "elastic=[64] must list other world sizes a resume may take, each a whole "
                                         "number from 1 to 32"),
    ({"world_size": 2, "elastic": [2]}, "elastic=[2] must list other world sizes"),
    ({"preemption": [0]}, "preemption=[0] must list grace periods in seconds, each a number > 0"),
    ({"preemption": [5], "command": ["{python}", "train.py"]}, "preemption= is not supported on a command target"),
])
def test_bad_distributed_options_name_the_fix(options, message):
    from pytest_resume_check.targets import TargetError

    with pytest.raises(TargetError, match=message.replace("[", r"\[").replace("]", r"\]")):
        command = options.pop("command", None)
        if command:
            resume_target.command(command, name="bad", steps=4, **options)
        else:
            resume_target(planted.ddp_one_rank, name="bad", steps=4, **options)


def test_the_grid_gives_each_distributed_kind_a_row():
    from pytest_resume_check.report import summary

    def cell(kill_id, passed=True, categories=()):
        kills = kill_ids.parse_kill_id(kill_id)
        return {"target": "ddp", "case_id": "shuffle", "resume_mode": "auto", "kill": kill_id,
                "kills": [k.to_json() for k in kills], "passed": passed, "categories": list(categories),
                "xfail_reason": None}

    cells = [cell("ckpt3"), cell("ckpt6:rank1"), cell("ckpt5+1:term2", False, ["STALE_RESUME"]), cell("ckpt3:ws1"),
             cell("ckpt6")]
    lines = summary.grid(cells)
    assert lines[0].endswith("; rows rankR: that rank alone killed, termG: SIGTERM with G s grace, wsW: resumed on "
                             "W ranks")
    assert lines[1:6] == ["                    3 6 5+1",
                          "shuffle auto        . .",
                          "shuffle auto rank1    .",
                          "shuffle auto term2      S",
                          "shuffle auto ws1    ."]


@pytest.mark.parametrize("kill", ["ckpt3", "ckpt6"])
def test_publishing_before_the_async_save_completed_fails_the_resume(engine, kill):
    result = run(engine, planted_target(planted.ddp_async_unawaited), kill)
    # The resumed run fails on the published checkpoint: DCP's metadata was never written (the background
    # write waits until publishing returned, and the kill came there).
    assert result.verdict.categories[0] == vd.RESUME_ERROR, result.verdict.headline
    assert result.runs[0].outcome == "killed" and len(result.runs) == 2
    assert f"step_{kill[4:]}/.metadata" in result.verdict.headline


def _record(events, world_size=2, outcome="done", kill=None):
    from pytest_resume_check.records import events as ev
    from pytest_resume_check.records.plan import RunPlan
    from pytest_resume_check.records.results import RunRecord

    plan = RunPlan("t", ("m", "", "f"), {}, 0, "/nonexistent", "/nonexistent/run.log", kill=kill,
                   world_size=world_size)
    return RunRecord(plan, [ev.Event(**e) for e in events], outcome)


def _steps(*steps, start=1):
    """Events of ranks 0 and 1 taking ``(id rank 0, id rank 1)`` per step, rank 1's reports first."""
    out = []
    for step, (a, b) in enumerate(steps, start=start):
        out += [{"kind": "consumed", "step": step, "epoch": 0, "ids": (b,), "rank": 1},
                {"kind": "consumed", "step": step, "epoch": 0, "ids": (a,), "rank": 0},
                {"kind": "step_end", "step": step, "rank": 1}, {"kind": "step_end", "step": step, "rank": 0}]
    return out


def test_the_global_ledger_is_step_by_step_and_rank_by_rank():
    from pytest_resume_check.records.ledger import Ledger

    ledger = Ledger.from_events(_record(_steps((0, 1), (2, 3))).events)
    assert [(e.id, e.rank) for e in ledger] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert ledger.of_rank(1).ids == [1, 3] and ledger.ranks == [0, 1]
    assert ledger.to_json()[1] == [1, 1, 0, 0, 1]


def test_ranks_that_swap_inputs_fail_their_own_ledgers_under_an_any_order_contract():
    from pytest_resume_check.records.plan import KillSpec
    from pytest_resume_check.targets import EXACTLY_ONCE

    reference = _record(_steps((0, 1), (2, 3)))
    first = _record(_steps((0, 1)) + [{"kind": "checkpoint", "step": 1, "rank": 0}], outcome="killed",
                    kill=KillSpec(1))
    resumed = _record([{"kind": "resumed", "step": 1, "rank": 0}, {"kind": "resumed", "step": 1, "rank": 1}]
                      + _steps((3, 2), start=2))
    verdict = vd.judge(reference, [first, resumed], EXACTLY_ONCE)
    assert verdict.categories == [vd.LOST, vd.DUPLICATED]
    assert verdict.findings[0].headline.startswith("LOST 1 input on rank 0 after resume from step 1: ids 2")
    assert verdict.findings[1].headline.startswith("DUPLICATED 1 input on rank 0 after resume from step 1: ids 3")
