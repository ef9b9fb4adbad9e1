"""The buffered input stream and the type-exact batch operations, on a real StatefulDataLoader."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
np = pytest.importorskip("numpy")
pytest.importorskip("torchdata")

from torch.utils.data import SequentialSampler  # noqa: E402
from torchdata.stateful_dataloader import Stateful, StatefulDataLoader  # noqa: E402
from torchdata.stateful_dataloader.sampler import RandomSampler  # noqa: E402

from agentlightning.verl.cpu_builder import SyntheticInputs, collate_inputs  # noqa: E402
from agentlightning.verl.inputs import (  # noqa: E402
    BufferedInputStream,
    batch_len,
    concat_batches,
    ids_of,
    select_rows,
    split_batch,
)


def make_batch(ids):
    prompts = np.empty(len(ids), dtype=object)
    prompts[:] = [[f"turn {i}", {"k": i}] for i in ids]  # object elements that are themselves lists
    return {
        "input_id": torch.tensor(ids, dtype=torch.int64),
        "scores": np.asarray(ids, dtype=np.float32),
        "prompt": prompts,
        "meta": [{"i": i} for i in ids],
    }


def assert_same_batch(actual, expected):
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert type(actual[key]) is type(value), key
        if isinstance(value, torch.Tensor):
            assert actual[key].dtype == value.dtype and torch.equal(actual[key], value)
        elif isinstance(value, np.ndarray):
            assert actual[key].dtype == value.dtype and actual[key].shape == value.shape
            assert actual[key].tolist() == value.tolist()
        else:
            assert actual[key] == value


def make_loader(size=10, batch_size=4, shuffle=False, seed=0, num_workers=0):
    dataset = SyntheticInputs(size, seed=seed)
    if shuffle:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    else:
        sampler = SequentialSampler(dataset)
    return StatefulDataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=collate_inputs,
        num_workers=num_workers,
    )


def stream_ids(stream, sizes):
    return [[(chunk.epoch, ids_of(chunk.batch, "input_id")) for chunk in stream.take(n)] for n in sizes]


def test_split_keeps_tensor_numpy_object_array_and_list_types():
    head, tail = split_batch(make_batch([0, 1, 2, 3]), 3)
    assert_same_batch(head, make_batch([0, 1, 2]))
    assert_same_batch(tail, make_batch([3]))
    assert tail["prompt"].dtype == object and tail["prompt"][0] == ["turn 3", {"k": 3}]


def test_split_at_the_ends_gives_an_empty_part():
    head, tail = split_batch(make_batch([0, 1]), 2)
    assert batch_len(head) == 2 and batch_len(tail) == 0
    head, tail = split_batch(make_batch([0, 1]), 0)
    assert batch_len(head) == 0 and batch_len(tail) == 2


def test_concat_inverts_split_exactly():
    batch = make_batch([5, 6, 7, 8])
    head, tail = split_batch(batch, 1)
    assert_same_batch(concat_batches([head, tail]), batch)


def test_select_rows_keeps_types_and_order():
    assert_same_batch(select_rows(make_batch([0, 1, 2]), [2, 0]), make_batch([2, 0]))


def test_concat_refuses_mixed_numpy_dtypes_instead_of_promoting():
    with pytest.raises(TypeError, match="mixes numpy dtypes"):
        concat_batches([{"x": np.zeros(1, np.int64)}, {"x": np.zeros(1, np.float32)}])


def test_unsupported_batch_values_are_refused_with_the_field_name():
    with pytest.raises(TypeError, match="'x' has type tuple"):
        split_batch({"x": (1, 2)}, 1)


def test_stream_is_a_torchdata_stateful():
    assert isinstance(BufferedInputStream(make_loader(), 1), Stateful)


def test_partial_take_buffers_the_rest_of_the_loader_batch():
    stream = BufferedInputStream(make_loader(size=12, batch_size=4), total_epochs=1)
    assert stream_ids(stream, [6]) == [[(0, [0, 1, 2, 3, 4, 5])]]
    assert stream.buffered == 2
    assert stream_ids(stream, [2]) == [[(0, [6, 7])]]
    assert stream.buffered == 0  # an empty buffer: the next take starts a new loader batch


def test_a_take_that_crosses_an_epoch_returns_one_chunk_per_epoch():
    stream = BufferedInputStream(make_loader(size=8, batch_size=4), total_epochs=2)
    assert stream_ids(stream, [6, 6]) == [[(0, [0, 1, 2, 3, 4, 5])], [(0, [6, 7]), (1, [0, 1, 2, 3])]]
    assert stream.epoch == 1


def test_the_stream_ends_after_total_epochs_and_counts_remaining_inputs():
    stream = BufferedInputStream(make_loader(size=10, batch_size=4), total_epochs=2)  # 2 batches/epoch
    assert stream.remaining() == 16
    stream.take(5)
    assert stream.remaining() == 11
    assert sum(len(c) for c in stream.take(100)) == 11
    assert stream.remaining() == 0 and stream.exhausted and stream.take(3) == []


def flatten(chunks):
    return [(c.epoch, i) for c in chunks for i in ids_of(c.batch, "input_id")]


@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffled"])
@pytest.mark.parametrize("taken", [0, 1, 4, 6, 8, 12, 13], ids=lambda n: f"after{n}")
def test_a_restored_stream_continues_exactly_where_the_saved_one_stopped(shuffle, taken):
    expected = flatten(BufferedInputStream(make_loader(size=12, shuffle=shuffle), total_epochs=3).take(36))
    saved = BufferedInputStream(make_loader(size=12, shuffle=shuffle), total_epochs=3)
    before = flatten(saved.take(taken))
    restored = BufferedInputStream(make_loader(size=12, shuffle=shuffle), total_epochs=3)
    restored.load_state_dict(saved.state_dict())
    after = []
    for n in [3, 5, 4, 7, 2, 9, 6, 11]:  # refills that do not line up with the loader batch of 4
        after += flatten(restored.take(n))
    assert before + after == expected


def test_a_state_saved_right_after_an_epochs_last_batch_restores_into_the_next_epoch():
    # torchdata yields one empty pass after restoring such a state (cf. meta-pytorch/data#1437);
    # the stream must count it as the end of the saved epoch, not as a whole epoch.
    saved = BufferedInputStream(make_loader(size=8, batch_size=4, shuffle=True), total_epochs=2)
    saved.take(8)
    restored = BufferedInputStream(make_loader(size=8, batch_size=4, shuffle=True), total_epochs=2)
    restored.load_state_dict(saved.state_dict())
    after_restore = flatten(restored.take(8))
    assert after_restore == flatten(saved.take(8))
    assert {epoch for epoch, _ in after_restore} == {1}
    assert restored.exhausted


def test_a_restored_stream_with_loader_workers_continues_exactly():
    saved = BufferedInputStream(make_loader(size=12, shuffle=True, num_workers=2), total_epochs=2)
    saved.take(5)
    state = saved.state_dict()
    expected = flatten(saved.take(19))
    restored = BufferedInputStream(make_loader(size=12, shuffle=True, num_workers=2), total_epochs=2)
    restored.load_state_dict(state)
    assert flatten(restored.take(19)) == expected
