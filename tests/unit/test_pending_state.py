"""A loader that applies its loaded state lazily is digested by the state it will continue from: right
after ``load_state_dict`` torchdata's ``StatefulDataLoader`` keeps the state for its next ``iter()`` and its
``StatefulDistributedSampler`` reports position 0 (torchdata 0.11), so a restored-step report of a correct
trainer would differ from the uninterrupted run's at the same position. The digest calls nothing on such
a loader: it starts no iterator and draws nothing from torch's generator."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import torch  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler  # noqa: E402

from pytest_resume_check.records import state as st  # noqa: E402

#: torchdata 0.11 warns at every loader it builds (a deprecated torch call of its own).
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

DATA = list(range(12))


def loader(shuffle: bool = True) -> tuple[StatefulDistributedSampler, StatefulDataLoader]:
    sampler = StatefulDistributedSampler(DATA, num_replicas=1, rank=0, shuffle=shuffle, seed=3)
    return sampler, StatefulDataLoader(DATA, batch_size=4, sampler=sampler)


def taken(batches: int) -> tuple[StatefulDistributedSampler, StatefulDataLoader, object]:
    """A loader (and its sampler and iterator) that yielded ``batches`` batches, as a run at that step."""
    sampler, dl = loader()
    it = iter(dl)
    for _ in range(batches):
        next(it)
    return sampler, dl, it


def restored(state: dict) -> tuple[StatefulDistributedSampler, StatefulDataLoader]:
    sampler, dl = loader()
    dl.load_state_dict(state)
    return sampler, dl


@pytest.mark.parametrize("batches", [1, 2, 3])
def test_a_restored_loader_digests_as_the_uninterrupted_one_at_the_same_position(batches):
    _, straight, _ = taken(batches)
    _, resumed = restored(straight.state_dict())
    assert st.leaf_digests(resumed) == st.leaf_digests(straight)


def test_what_torchdata_itself_says_right_after_loading_differs_so_the_digest_does_not_ask_it():
    _, straight, _ = taken(2)
    _, resumed = restored(straight.state_dict())
    # The torchdata behaviour the digest reads past: position 0 until the next iter().
    said = restored(straight.state_dict())[1].state_dict()
    assert said["_sampler_iter_state"]["sampler_state"]["yielded"] == 0 != straight.state_dict()[
        "_sampler_iter_state"]["sampler_state"]["yielded"]
    assert st.first_differing_key(st.leaf_digests(said), st.leaf_digests(straight)) is not None
    assert st.leaf_digests(resumed) == st.leaf_digests(straight)


def test_digesting_a_restored_loader_starts_no_iterator_and_draws_nothing():
    _, straight, it = taken(1)
    _, resumed = restored(straight.state_dict())
    rest = [b.tolist() for b in it]
    before = torch.get_rng_state()
    st.leaf_digests(resumed)
    assert resumed._iterator is None and resumed.next_iter_state is not None
    assert torch.equal(torch.get_rng_state(), before)
    assert [b.tolist() for b in resumed] == rest  # it continues where the uninterrupted loader did


def test_a_restored_sampler_digests_by_the_position_it_will_continue_from():
    straight_sampler, _, _ = taken(2)
    sampler, _ = loader()
    sampler.load_state_dict(straight_sampler.state_dict())
    assert sampler.state_dict() == {"yielded": 0}  # torchdata's own answer until iter()
    assert st.leaf_digests(sampler) == st.leaf_digests(straight_sampler)


def test_a_loader_that_is_iterating_is_digested_by_its_own_state_dict():
    _, dl, _ = taken(2)
    assert st.pending_state(dl) is None
    assert st.leaf_digests(dl) == st.leaf_digests(dl.state_dict())
