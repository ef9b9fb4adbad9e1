"""``ids_of`` reads the ids back from a verl ``DataProto`` batch (the other batch shapes: tests/unit/test_ids.py)."""

from __future__ import annotations

import pytest
from optional import requires

from pytest_resume_check.ids import ids_of


@pytest.mark.slow
@requires("torch", "numpy", "verl")
def test_ids_from_a_verl_dataproto_in_either_place():
    import numpy as np
    import torch
    from verl import DataProto

    in_tensors = DataProto.from_dict(tensors={"input_id": torch.tensor([5, 6]), "x": torch.zeros(2, 3)})
    assert ids_of(in_tensors) == [5, 6]
    in_numpy = DataProto.from_dict(tensors={"x": torch.zeros(2, 3)},
                                   non_tensors={"input_id": np.array([9, 10], dtype=object)})
    assert ids_of(in_numpy) == [9, 10]
