"""A run that torchrun restarted within itself, split into the runs of an interrupted job: each
attempt's events by the stamp of its workers, the launcher's and the supervisor's by the event before them."""

from __future__ import annotations

from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import KillSpec, RunPlan
from pytest_resume_check.records.results import Outcome, RunRecord, attempts_of, last_attempt, split_restarts


def plan(**kw):
    return RunPlan("t", ("m", "f", "fn"), {}, 0, "/ckpt", "/run0.log", world_size=2, launcher="torchrun",
                   max_restarts=1, kill=KillSpec(3, rank=1), checkpoint_steps=frozenset({3}), **kw)


def restarted_run():
    events = [
        ev.Event(ev.RESUMED, step=0, rank=0), ev.Event(ev.RESUMED, step=0, rank=1),
        ev.Event(ev.STEP_END, step=3, rank=0), ev.Event(ev.CHECKPOINT, step=3, rank=0),
        ev.Event(ev.KILL_READY, rank=1, text="rank 1 alone killed"),
        ev.Event(ev.SIGNALLED, text="SIGKILL", extra={"signal": "kill", "rank": 1, "restart": True}),
        ev.Event(ev.ERROR, rank=0, text="RuntimeError: Connection closed by peer"),  # the kill's consequence
        ev.Event(ev.RESUMED, step=3, rank=0, attempt=1), ev.Event(ev.RESUMED, step=3, rank=1, attempt=1),
        ev.Event(ev.STEP_END, step=4, rank=0, attempt=1),
        ev.Event(ev.DONE),  # the launcher's: after every attempt
    ]
    return RunRecord(plan(), events, Outcome.DONE, exitcode=0)


def test_events_belong_to_the_attempt_their_worker_stamped_or_to_that_of_the_event_before():
    rec = restarted_run()
    assert attempts_of(rec.events) == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert [e.kind for e in last_attempt(rec.events)] == [ev.RESUMED, ev.RESUMED, ev.STEP_END, ev.DONE]


def test_a_restarted_run_is_a_killed_first_attempt_and_a_resumed_restart():
    first, restart = split_restarts(restarted_run())
    assert first.outcome == Outcome.KILLED and first.plan.kill == KillSpec(3, rank=1)
    assert ev.ERROR not in [e.kind for e in first.events]  # a peer dying in a collective after the kill
    assert first.published == [(3, None)]
    assert restart.outcome == Outcome.DONE and restart.plan.restart == 1
    assert restart.plan.kill is None and restart.plan.is_resume and restart.plan.report_state
    assert restart.resumed_by_rank == {0: (3, None), 1: (3, None)}
    assert restart.describe() == "torchrun's restart 1: ran to the end"


def test_an_attempt_that_failed_by_itself_keeps_its_error():
    rec = restarted_run()
    rec.events = [e for e in rec.events if e.kind not in (ev.KILL_READY, ev.SIGNALLED)]
    first, _ = split_restarts(rec)
    assert first.outcome == Outcome.RAISED and "Connection closed" in first.error


def test_a_run_without_restarts_is_itself():
    rec = RunRecord(plan(), [ev.Event(ev.STEP_END, step=1, rank=0), ev.Event(ev.DONE)], Outcome.DONE)
    assert split_restarts(rec) == [rec]


def test_an_attempt_stopped_for_a_rejoining_node_is_killed_after_its_checkpoint_and_rounds_may_skip():
    node_plan = RunPlan("t", ("m", "f", "fn"), {}, 0, "/ckpt", "/run0.log", world_size=2, launcher="torchrun",
                        max_restarts=1, kill=KillSpec(3, node=1, rejoin=5), nnodes=(1, 2))
    events = [
        ev.Event(ev.STEP_END, step=3, rank=0), ev.Event(ev.CHECKPOINT, step=3, rank=0),
        ev.Event(ev.SIGNALLED, text="SIGKILL", extra={"signal": "kill", "node": 1, "restart": True}),
        ev.Event(ev.RANKS, rank=0, attempt=1, extra={"pid": 10, "agent": 1, "world_size": 1}),
        ev.Event(ev.RESUMED, step=3, rank=0, attempt=1), ev.Event(ev.STEP_END, step=5, rank=0, attempt=1),
        ev.Event(ev.CHECKPOINT, step=5, rank=0, attempt=1), ev.Event(ev.PAUSED, step=5, rank=0, attempt=1),
        ev.Event(ev.SIGNALLED, step=5, text="rejoin", extra={"signal": "rejoin", "rejoin": 5, "ranks_past": []}),
        ev.Event(ev.ERROR, rank=0, attempt=1, text="stopped"),  # after the stop: left out
        # A round that started no worker is no attempt: the next one is the second restart all the same.
        ev.Event(ev.RANKS, rank=0, attempt=3, extra={"pid": 11, "agent": 1, "world_size": 2}),
        ev.Event(ev.RESUMED, step=5, rank=0, attempt=3), ev.Event(ev.RESUMED, step=5, rank=1, attempt=3),
        ev.Event(ev.DONE),
    ]
    first, without, back = split_restarts(RunRecord(node_plan, events, Outcome.DONE, exitcode=0))
    assert first.plan.kill == KillSpec(3, node=1, rejoin=5)
    assert without.outcome == Outcome.KILLED and without.plan.kill == KillSpec(5, rejoin=5)
    assert without.plan.world_size == 1 and ev.ERROR not in [e.kind for e in without.events]
    assert without.describe().startswith("torchrun's restart 1: stopped by torchrun for the lost node's return right "
                                         "after checkpoint of step 5")
    assert (back.plan.restart, back.plan.world_size, back.outcome) == (2, 2, Outcome.DONE)
