"""Id helpers: the dataset wrapper and reading ids back from common batch shapes."""

from __future__ import annotations

import pytest
from optional import requires

from pytest_resume_check.ids import WithIds, ids_of


def test_wrapper_adds_the_index_to_dict_items_and_wraps_other_items():
    wrapped = WithIds([{"x": 1}, {"x": 2}])
    assert wrapped[1] == {"x": 2, "input_id": 1} and len(wrapped) == 2
    assert WithIds(["a", "b"], id_key="key")[0] == {"input": "a", "key": 0}


def test_wrapper_refuses_to_overwrite_an_existing_id_key():
    with pytest.raises(KeyError, match="another id_key"):
        WithIds([{"input_id": 5}])[0]


def test_ids_from_a_dict_of_lists_and_from_a_list_of_items():
    assert ids_of({"input_id": [3, 1, 2]}) == [3, 1, 2]
    assert ids_of([{"input_id": 4}, {"input_id": 5}]) == [4, 5]


def test_missing_id_key_names_the_wrapper_to_use():
    with pytest.raises(KeyError, match="WithIds"):
        ids_of({"x": [1]})


@requires("numpy")
def test_ids_from_numpy_arrays_including_object_arrays():
    import numpy as np

    assert ids_of({"input_id": np.array([7, 8])}) == [7, 8]
    assert ids_of({"uid": np.array(["a", "b"], dtype=object)}, id_key="uid") == ["a", "b"]


@requires("torch")
def test_ids_from_a_collated_tensor_batch():
    import torch
    from torch.utils.data import default_collate

    batch = default_collate([WithIds([torch.zeros(2)] * 3)[i] for i in range(3)])
    assert ids_of(batch) == [0, 1, 2]
