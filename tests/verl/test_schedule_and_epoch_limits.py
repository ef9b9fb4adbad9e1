"""The pure-Python step schedule against the real trainer, and the epoch limits of async refills.

The resume-check matrix takes each async case's step count from
:func:`agentlightning.verl.schedule.simulate_async_schedule`; these tests hold the simulation to the real
trainer input by input, for every case of the matrix, and check the epoch limits the schedule assumes:
no refill takes inputs beyond ``trainer.total_epochs`` and the run ends with the step that trains the
last admitted input.
"""

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")

from agentlightning.verl import resume_target as rt  # noqa: E402
from agentlightning.verl.cpu_builder import build_cpu_trainer, epoch_orders  # noqa: E402
from agentlightning.verl.schedule import (  # noqa: E402
    LATENCY_PROFILES,
    long_tail_latency,
    simulate_async_schedule,
)
from agentlightning.verl.testing import RecordingObserver  # noqa: E402


def run_case(tmp_path, case, seed=11):
    p = rt.params(case)
    trainer = build_cpu_trainer(
        str(tmp_path), dataset_size=p["n"], train_batch_size=p["batch"], async_train_batch_size=p["refill"],
        total_epochs=p["epochs"], shuffle=p["shuffle"], seed=seed, num_workers=p["workers"],
        latency_profile=LATENCY_PROFILES[p["latency"]], resume_mode="disable",
    )
    trainer.input_observer = RecordingObserver()
    trainer.fit()
    return trainer, trainer.input_observer


def steps_by_input(observer, kind):
    return {(epoch, i): step for event, step, epoch, ids in observer.events if event == kind for i in ids}


@pytest.mark.parametrize("case", rt.ASYNC_CASES, ids=[c["id"] for c in rt.ASYNC_CASES])
def test_the_simulated_schedule_is_the_trainers_input_by_input(tmp_path, case):
    _, observer = run_case(tmp_path, case)
    schedule = rt.async_schedule(case)
    admitted = observer.ledger("consumed")  # admission order
    consumed_at, trained_at = steps_by_input(observer, "consumed"), steps_by_input(observer, "trained")
    assert [consumed_at[item] for item in admitted] == list(schedule.admitted_at)
    assert [trained_at[item] for item in admitted] == list(schedule.trained_at)
    assert observer.steps()[-1] == schedule.steps == rt.async_steps(case)


def test_every_latency_profile_but_fast_carries_groups_over_across_checkpoint_steps():
    for case in rt.ASYNC_CASES:
        schedule = rt.async_schedule(case)
        carried = [schedule.carried_over_after(step) for step in range(1, schedule.steps)]
        assert any(carried) == (rt.params(case)["latency"] != "fast"), case["id"]
    tail = rt.async_schedule({"refill": 8, "latency": "tail"})
    assert max(t - a for a, t in zip(tail.admitted_at, tail.trained_at)) >= 4  # spans several steps


@pytest.mark.parametrize("workers", [0, 2])
def test_the_latency_follows_the_admission_order_whatever_the_shuffle(tmp_path, workers):
    trainer = build_cpu_trainer(str(tmp_path), dataset_size=12, shuffle=True, seed=5, num_workers=workers,
                                latency_profile=long_tail_latency, resume_mode="disable")
    orders = epoch_orders(trainer.train_dataloader, 2)
    assert epoch_orders(trainer.train_dataloader, 2) == orders  # computing them left the loader untouched
    assert orders[0] != sorted(orders[0])
    trainer.input_observer = RecordingObserver()
    trainer.fit()
    admitted = trainer.input_observer.ledger("consumed")
    assert [i for _, i in admitted] == orders[0] + orders[1]
    latency = trainer.rollout_engine.latency
    assert [latency.admission_index(i, e) for e, i in admitted] == list(range(len(admitted)))
    assert [latency(i, e) for e, i in admitted] == [long_tail_latency(k) for k in range(len(admitted))]


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_refill_never_takes_inputs_beyond_the_last_epoch(tmp_path, epochs):
    case = {"refill": 9, "epochs": epochs, "latency": "tail", "shuffle": True}
    trainer, observer = run_case(tmp_path, case)
    consumed = observer.ledger("consumed")
    assert len(consumed) == 24 * epochs
    assert {epoch for epoch, _ in consumed} == set(range(epochs))
    for epoch in range(epochs):
        assert sorted(i for e, i in consumed if e == epoch) == list(range(24))
    assert trainer.input_stream.exhausted and trainer.input_stream.epoch == epochs
    last_admission = max(step for kind, step, _, _ in observer.events if kind == "consumed")
    assert observer.steps()[-1] > last_admission  # the long tail is trained after the last refill


@pytest.mark.parametrize("latency", list(LATENCY_PROFILES))
def test_training_ends_with_the_step_that_trains_the_last_admitted_input(tmp_path, latency):
    _, observer = run_case(tmp_path, {"refill": 7, "latency": latency})
    assert Counter(observer.ledger("trained")) == Counter(observer.ledger("consumed"))  # each once
    last_trained = max(step for kind, step, _, _ in observer.events if kind == "trained")
    assert observer.steps()[-1] == last_trained
    expected = simulate_async_schedule(dataset_size=24, train_batch_size=4, async_train_batch_size=7,
                                       total_epochs=2, latency=LATENCY_PROFILES[latency])
    assert observer.steps() == list(range(1, expected.steps + 1))
