"""The in-flight record: original rows of carried-over groups, in order, with their submission steps."""

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("verl")

from agentlightning.verl.inflight import (  # noqa: E402
    STATE_KEYS,
    InFlightInputs,
    InFlightRecordError,
)


def make_batch(ids):
    prompts = np.empty(len(ids), dtype=object)
    prompts[:] = [f"prompt {i}" for i in ids]
    return {
        "input_id": torch.tensor(ids, dtype=torch.int64),
        "features": torch.arange(len(ids) * 2, dtype=torch.float32).reshape(len(ids), 2) + ids[0],
        "prompt": prompts,
        "meta": [{"index": i} for i in ids],
    }


def test_completed_groups_leave_the_record_and_the_rest_keep_submission_order():
    record = InFlightInputs()
    record.add(make_batch([4, 5, 6]), [4, 5, 6], epoch=0, step=1)
    record.add(make_batch([7, 0]), [7, 0], epoch=0, step=2)
    record.complete([5, 7], [0, 0])
    assert [(g.input_id, g.epoch, g.submitted_step) for g in record.groups] == [(4, 0, 1), (6, 0, 1), (0, 0, 2)]
    assert len(record) == 3


def test_the_same_id_in_two_epochs_is_matched_by_its_epoch():
    record = InFlightInputs()
    record.add(make_batch([3]), [3], epoch=0, step=4)
    record.add(make_batch([3]), [3], epoch=1, step=5)
    record.complete([3], [1])
    assert [(g.input_id, g.epoch) for g in record.groups] == [(3, 0)]


def test_completing_an_input_that_is_not_in_flight_is_a_clear_error():
    record = InFlightInputs()
    record.add(make_batch([1]), [1], epoch=0, step=1)
    with pytest.raises(InFlightRecordError, match="input 2 .*not in flight"):
        record.complete([2], [0])


def test_resubmissions_recreate_the_original_calls_in_order():
    record = InFlightInputs()
    record.add(make_batch([0, 1, 2]), [0, 1, 2], epoch=0, step=1)
    record.add(make_batch([3, 4]), [3, 4], epoch=0, step=2)
    record.add(make_batch([5]), [5], epoch=1, step=2)  # an epoch-crossing refill is two submissions
    record.complete([1, 4], [0, 0])
    calls = record.resubmissions()
    assert [(c.ids, c.epoch, c.step) for c in calls] == [([0, 2], 0, 1), ([3], 0, 2), ([5], 1, 2)]
    first = calls[0].batch
    assert first["input_id"].tolist() == [0, 2]
    assert first["prompt"].dtype == object and first["prompt"].tolist() == ["prompt 0", "prompt 2"]
    assert first["meta"] == [{"index": 0}, {"index": 2}]
    assert torch.equal(first["features"], make_batch([0, 1, 2])["features"][[0, 2]])


def test_the_record_keeps_original_rows_when_an_engine_transforms_its_input_in_place():
    record = InFlightInputs()
    batch = make_batch([0, 1])
    record.add(batch, [0, 1], epoch=0, step=1)
    batch["meta"][0]["index"] = "transformed"  # an engine mutating the rows it was given
    batch["prompt"][1] = "transformed"
    batch["features"].add_(100.0)
    rows = record.state_dict()["rows"]
    assert rows[0]["meta"] == [{"index": 0}] and rows[1]["prompt"].tolist() == ["prompt 1"]
    assert rows[0]["features"].tolist() == [[0.0, 1.0]]


def test_the_state_round_trips_and_is_eagerly_loaded():
    record = InFlightInputs()
    record.add(make_batch([8, 9]), [8, 9], epoch=1, step=6)
    state = record.state_dict()
    assert set(state) == set(STATE_KEYS)
    assert state["input_ids"] == [8, 9] and state["input_epochs"] == [1, 1] and state["submitted_steps"] == [6, 6]
    restored = InFlightInputs()
    restored.load_state_dict(state)
    assert [(g.input_id, g.epoch, g.submitted_step) for g in restored.groups] == [(8, 1, 6), (9, 1, 6)]
    assert [(c.ids, c.step) for c in restored.resubmissions()] == [([8, 9], 6)]


def test_an_inconsistent_state_is_refused():
    record = InFlightInputs()
    with pytest.raises(KeyError, match="lacks"):
        record.load_state_dict({"rows": []})
    with pytest.raises(ValueError, match="different lengths"):
        record.load_state_dict({"rows": [], "input_ids": [1], "input_epochs": [], "submitted_steps": []})
