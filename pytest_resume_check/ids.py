"""Input ids: a dataset wrapper that attaches them, and helpers that read them back from batches.

Nothing here imports torch or numpy; batches are inspected by duck typing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_ID_KEY", "WithIds", "ids_of"]

DEFAULT_ID_KEY = "input_id"


class WithIds:
    """A map-style dataset whose items carry their index as a stable id.

    Dict items get an extra ``id_key`` entry; any other item ``x`` becomes ``{"input": x, id_key: i}``.
    Collated by the default collate function, a batch is then a dict with an id tensor under ``id_key``.
    """

    def __init__(self, dataset: Any, id_key: str = DEFAULT_ID_KEY):
        self.dataset = dataset
        self.id_key = id_key

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.dataset[index]
        if isinstance(item, Mapping):
            if self.id_key in item:
                raise KeyError(f"dataset items already have a {self.id_key!r} key; pass another id_key")
            return {**item, self.id_key: index}
        return {"input": item, self.id_key: index}


def ids_of(batch: Any, id_key: str = DEFAULT_ID_KEY) -> list[Any]:
    """The ids of a batch, as plain Python values, in batch order.

    Understands: a dict whose ``id_key`` entry is a tensor, numpy array or list; a sequence of dict
    items; and a verl ``DataProto`` (id in ``non_tensor_batch`` or in its tensor batch).
    """
    if hasattr(batch, "non_tensor_batch") and hasattr(batch, "batch"):  # verl DataProto
        if id_key in batch.non_tensor_batch:
            return _plain(batch.non_tensor_batch[id_key])
        if batch.batch is not None and id_key in batch.batch.keys():
            return _plain(batch.batch[id_key])
        raise KeyError(f"DataProto has no {id_key!r} in non_tensor_batch or batch")
    if isinstance(batch, Mapping):
        if id_key not in batch:
            raise KeyError(f"batch has no {id_key!r} key (keys: {sorted(batch)[:8]}); wrap the dataset "
                           "in pytest_resume_check.WithIds or pass id_key=")
        return _plain(batch[id_key])
    if isinstance(batch, Sequence) and batch and isinstance(batch[0], Mapping):
        return [_scalar(item[id_key]) for item in batch]
    raise TypeError(f"cannot find ids in a {type(batch).__name__}; pass a dict batch with {id_key!r}")


def _plain(values: Any) -> list[Any]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [_scalar(v) for v in values]


def _scalar(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
    return v
