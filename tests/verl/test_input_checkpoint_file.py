"""agentlightning_input.pt: safe encoding, validated reads, atomic writes (corruption: test_corruption_corpus.py)."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
np = pytest.importorskip("numpy")

from agentlightning.verl import errors, inflight, input_file  # noqa: E402
from agentlightning.verl import input_format as fmt  # noqa: E402
from agentlightning.verl import verl_layout as layout  # noqa: E402
from agentlightning.verl.inputs import STATE_KEYS  # noqa: E402


def stream_state(tail):
    return {
        "loader_state": {"_num_yielded": 3, "generator": torch.arange(4, dtype=torch.uint8), "x": None},
        "buffered_tail": tail,
        "input_epoch": 1,
        "loader_batches_taken_in_epoch": 3,
    }


def mixed_tail():
    prompts = np.empty(2, dtype=object)
    prompts[0] = ["a", {"nested": [1, 2]}]
    prompts[1] = "plain"
    return {
        "input_id": torch.tensor([6, 7]),
        "features": torch.randn(2, 3),
        "prompt": prompts,
        "labels": np.array(["x", "yz"]),
        "weights": np.array([[1.5, 2.5], [3.5, 4.5]], dtype=np.float16),
        "flags": np.array([True, False]),
        "scalar": np.int32(7),
        "meta": [{"turns": 2}, {"turns": 3}],
    }


def carried_over(rows):
    return {
        "rows": rows,
        "input_ids": [int(r["input_id"][0]) for r in rows],
        "input_epochs": [1] * len(rows),
        "submitted_steps": list(range(3, 3 + len(rows))),
    }


def one_row(i):
    prompts = np.empty(1, dtype=object)
    prompts[0] = {"text": f"prompt {i}", "turns": [i]}
    return {"input_id": torch.tensor([i]), "features": torch.randn(1, 3), "prompt": prompts, "meta": [{"i": i}]}


def write_format_1(folder, step, stream):
    """What a writer of format version 1 produced: no carried-over groups."""
    payload = {fmt.KEY_FORMAT_VERSION: 1, fmt.KEY_GLOBAL_STEP: step, fmt.KEY_INPUT_STREAM: stream}
    torch.save(payload, os.path.join(folder, layout.INPUT_STATE_FILENAME))


def assert_equal_values(actual, expected):
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_equal_values(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_equal_values(a, e)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        if expected.dtype == object:
            for a, e in zip(actual.reshape(-1), expected.reshape(-1), strict=True):
                assert_equal_values(a, e)
        else:
            assert np.array_equal(actual, expected)
    else:
        assert actual == expected


def test_tensor_numpy_object_array_and_list_payloads_round_trip_exactly(tmp_path):
    state = stream_state(mixed_tail())
    input_file.write_input_state(str(tmp_path), 5, state)
    assert_equal_values(input_file.read_input_state(str(tmp_path), expected_step=5), state)


@pytest.fixture
def no_allow_list():
    """Empty torch's weights_only allow-list (verl's imports register entries) for the test."""
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    yield
    torch.serialization.add_safe_globals(registered)


def test_the_file_loads_with_weights_only_and_no_allow_list(tmp_path, no_allow_list):
    groups = carried_over([one_row(4), one_row(9)])
    path = input_file.write_input_state(str(tmp_path), 5, stream_state(mixed_tail()), groups)
    payload = torch.load(path, weights_only=True)
    assert payload[fmt.KEY_FORMAT_VERSION] == fmt.INPUT_STATE_FORMAT_VERSION == 2
    assert payload[fmt.KEY_GLOBAL_STEP] == 5
    assert set(payload[fmt.KEY_INPUT_STREAM]) == set(STATE_KEYS)
    assert set(payload[fmt.KEY_CARRIED_OVER]) == set(inflight.STATE_KEYS)
    assert payload[fmt.KEY_CARRIED_OVER]["submitted_steps"] == [3, 4]


def test_carried_over_rows_round_trip_exactly_with_their_ids_epochs_and_submission_steps(tmp_path):
    groups = carried_over([one_row(4), one_row(9)])
    input_file.write_input_state(str(tmp_path), 5, stream_state(None), groups)
    checkpoint = input_file.read_input_checkpoint(str(tmp_path), expected_step=5)
    assert checkpoint.format_version == 2 and checkpoint.records_carried_over
    assert_equal_values(checkpoint.carried_over, groups)


def test_nothing_in_flight_is_stored_as_an_empty_record(tmp_path):
    input_file.write_input_state(str(tmp_path), 2, stream_state(None))
    checkpoint = input_file.read_input_checkpoint(str(tmp_path))
    assert checkpoint.records_carried_over
    assert checkpoint.carried_over == {key: [] for key in inflight.STATE_KEYS}


def test_a_format_1_file_is_read_without_carried_over_groups(tmp_path):
    write_format_1(str(tmp_path), 4, stream_state(None))
    checkpoint = input_file.read_input_checkpoint(str(tmp_path), expected_step=4)
    assert checkpoint.format_version == 1 and not checkpoint.records_carried_over
    assert checkpoint.carried_over is None
    assert checkpoint.stream["input_epoch"] == 1


def test_a_format_2_file_without_its_carried_over_groups_is_a_corrupt_checkpoint_error(tmp_path):
    path = input_file.write_input_state(str(tmp_path), 2, stream_state(None))
    payload = torch.load(path, weights_only=True)
    del payload[fmt.KEY_CARRIED_OVER]
    torch.save(payload, path)
    with pytest.raises(errors.InputCheckpointCorruptError, match="carried_over.rows"):
        input_file.read_input_checkpoint(str(tmp_path))


def test_an_empty_buffer_is_stored_as_none(tmp_path):
    input_file.write_input_state(str(tmp_path), 2, stream_state(None))
    assert input_file.read_input_state(str(tmp_path))["buffered_tail"] is None


def test_a_folder_without_the_file_reads_as_none(tmp_path):
    assert input_file.read_input_state(str(tmp_path)) is None


def test_objects_that_would_need_pickled_code_are_refused_at_save(tmp_path):
    class Custom:
        pass

    with pytest.raises(errors.InputCheckpointEncodeError) as info:
        input_file.write_input_state(str(tmp_path), 1, stream_state({"meta": [Custom()]}))
    assert "input_stream['buffered_tail']['meta'][0]" in str(info.value)
    assert str(tmp_path) in str(info.value)
    row = {"input_id": torch.tensor([1]), "meta": [Custom()]}
    with pytest.raises(errors.InputCheckpointEncodeError) as info:
        input_file.write_input_state(str(tmp_path), 1, stream_state(None), carried_over([row]))
    assert "carried_over['rows'][0]['meta'][0]" in str(info.value)
    assert str(tmp_path) in str(info.value)
    assert os.listdir(tmp_path) == []


def test_an_unknown_format_version_names_the_file_the_version_and_the_supported_ones(tmp_path):
    path = os.path.join(tmp_path, layout.INPUT_STATE_FILENAME)
    torch.save({fmt.KEY_FORMAT_VERSION: 99, fmt.KEY_GLOBAL_STEP: 1, fmt.KEY_INPUT_STREAM: {}}, path)
    with pytest.raises(errors.InputCheckpointVersionError) as info:
        input_file.read_input_state(str(tmp_path))
    message = str(info.value)
    assert path in message and "version 99" in message and "supported: 1, 2" in message
    assert info.value.found == 99 and info.value.supported == (1, 2)


def test_an_unreadable_file_is_a_corrupt_checkpoint_error(tmp_path):
    with open(os.path.join(tmp_path, layout.INPUT_STATE_FILENAME), "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(errors.InputCheckpointCorruptError, match="is not a torch zip archive"):
        input_file.read_input_state(str(tmp_path))


def test_a_file_missing_entries_is_a_corrupt_checkpoint_error(tmp_path):
    torch.save({fmt.KEY_FORMAT_VERSION: 2, fmt.KEY_GLOBAL_STEP: 1, fmt.KEY_INPUT_STREAM: {}},
               os.path.join(tmp_path, layout.INPUT_STATE_FILENAME))
    with pytest.raises(errors.InputCheckpointCorruptError, match="lacks required entries"):
        input_file.read_input_state(str(tmp_path))


def test_a_file_from_another_step_is_refused(tmp_path):
    input_file.write_input_state(str(tmp_path), 3, stream_state(None))
    with pytest.raises(errors.InputCheckpointStepMismatchError, match="records global step 3"):
        input_file.read_input_state(str(tmp_path), expected_step=4)


def test_a_write_that_fails_part_way_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    input_file.write_input_state(str(tmp_path), 1, stream_state(None))
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(input_file.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        input_file.write_input_state(str(tmp_path), 1, stream_state(mixed_tail()))
    monkeypatch.setattr(input_file.torch, "save", real_save)
    assert os.listdir(tmp_path) == [layout.INPUT_STATE_FILENAME]
    assert input_file.read_input_state(str(tmp_path))["buffered_tail"] is None


def test_the_write_goes_through_an_open_file_and_is_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(input_file.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    saved_to = []
    real_save = torch.save
    def recording_save(obj, f, **kwargs):
        saved_to.append(f)
        return real_save(obj, f, **kwargs)

    monkeypatch.setattr(input_file.torch, "save", recording_save)
    input_file.write_input_state(str(tmp_path), 1, stream_state(None))
    assert len(synced) == 2  # the file, then its folder
    assert not isinstance(saved_to[0], (str, os.PathLike))


def test_the_temporary_file_of_a_writer_killed_mid_write_is_overwritten_and_moved_into_place(tmp_path):
    stale = tmp_path / f"{layout.INPUT_STATE_FILENAME}.tmp"
    stale.write_bytes(b"half a file")
    input_file.write_input_state(str(tmp_path), 1, stream_state(None))
    assert os.listdir(tmp_path) == [layout.INPUT_STATE_FILENAME]
