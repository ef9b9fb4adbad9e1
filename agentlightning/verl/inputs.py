"""The buffered input stream of the trainer: take any number of inputs from a batch-wise loader.

The async trainer refills ``async_train_batch_size - carried_over`` inputs per step while the loader
yields fixed batches of ``data.train_batch_size``. A refill therefore often takes only the head of a
loader batch; the tail waits in a buffer for the next refill. The loader itself has already moved past
the whole batch, so the loader state alone does not say where the input stream stands: the buffer and
the input epoch are part of the position too. :class:`BufferedInputStream` keeps all three together
and saves and restores them as one ``Stateful`` object.

Batches are dicts whose values are ``torch.Tensor``, ``numpy.ndarray`` (object arrays included) or
``list``, all with the same first dimension. Splitting and concatenation keep each value's type, dtype
and (for tensors) device exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Batch = dict[str, Any]

# Keys of BufferedInputStream.state_dict().
STATE_LOADER = "loader_state"
STATE_BUFFERED_TAIL = "buffered_tail"
STATE_INPUT_EPOCH = "input_epoch"
STATE_BATCHES_TAKEN = "loader_batches_taken_in_epoch"
STATE_KEYS = (STATE_LOADER, STATE_BUFFERED_TAIL, STATE_INPUT_EPOCH, STATE_BATCHES_TAKEN)


def batch_len(batch: Batch) -> int:
    """Number of inputs in ``batch`` (the common first dimension of its values)."""
    lengths = {key: len(value) for key, value in batch.items()}
    if not lengths:
        return 0
    if len(set(lengths.values())) != 1:
        raise ValueError(f"batch values have different lengths: {lengths}")
    return next(iter(lengths.values()))


def _check_supported(key: str, value: Any) -> None:
    if not isinstance(value, (torch.Tensor, np.ndarray, list)):
        raise TypeError(
            f"batch field {key!r} has type {type(value).__name__}; batches may hold only torch.Tensor, "
            "numpy.ndarray and list values (return one of these from the collate function)"
        )


def select_rows(batch: Batch, indices: Sequence[int]) -> Batch:
    """The inputs at ``indices`` of ``batch``, in that order, with every value's type kept."""
    out: Batch = {}
    for key, value in batch.items():
        _check_supported(key, value)
        if isinstance(value, torch.Tensor):
            out[key] = value[torch.as_tensor(list(indices), dtype=torch.long, device=value.device)]
        elif isinstance(value, np.ndarray):
            out[key] = value[np.asarray(list(indices), dtype=np.intp)]
        else:
            out[key] = [value[i] for i in indices]
    return out


def split_batch(batch: Batch, n: int) -> tuple[Batch, Batch]:
    """Split ``batch`` into its first ``n`` inputs and the rest; both parts keep every value's type."""
    size = batch_len(batch)
    if not 0 <= n <= size:
        raise ValueError(f"cannot split {n} inputs off a batch of {size}")
    head: Batch = {}
    tail: Batch = {}
    for key, value in batch.items():
        _check_supported(key, value)
        # Slices of tensors and arrays are views; copy the tail so a buffered tail does not pin the
        # whole loader batch in memory and so it pickles/saves on its own.
        head[key] = value[:n]
        tail[key] = value[n:].clone() if isinstance(value, torch.Tensor) else value[n:].copy()
    return head, tail


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Concatenate batches with identical keys and value types, in order."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return dict(batches[0])
    keys = list(batches[0])
    for other in batches[1:]:
        if list(other) != keys:
            raise ValueError(f"cannot concatenate batches with different keys: {keys} and {list(other)}")
    out: Batch = {}
    for key in keys:
        values = [b[key] for b in batches]
        kinds = {type(v) for v in values}
        for value in values:
            _check_supported(key, value)
        if len(kinds) != 1:
            raise TypeError(f"batch field {key!r} mixes types {sorted(k.__name__ for k in kinds)}")
        first = values[0]
        if isinstance(first, torch.Tensor):
            out[key] = torch.cat(values, dim=0)
        elif isinstance(first, np.ndarray):
            dtypes = {v.dtype for v in values}
            if len(dtypes) != 1:
                # np.concatenate would silently promote (e.g. int to float); refuse instead.
                raise TypeError(f"batch field {key!r} mixes numpy dtypes {sorted(map(str, dtypes))}")
            out[key] = np.concatenate(values, axis=0)
        else:
            out[key] = [item for value in values for item in value]
    return out


def ids_of(batch: Batch, key: str) -> list[int]:
    """The integer input ids stored under ``key`` of ``batch``, as plain ints."""
    if key not in batch:
        raise KeyError(f"batch has no input id field {key!r} (fields: {sorted(batch)})")
    value = batch[key]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.tolist()]
    if isinstance(value, np.ndarray):
        return [int(v) for v in value.tolist()]
    return [int(v) for v in value]


@dataclass
class InputChunk:
    """Consecutive inputs taken from the stream that all belong to one input epoch."""

    batch: Batch
    epoch: int

    def __len__(self) -> int:
        return batch_len(self.batch)


class BufferedInputStream:
    """Inputs of a batch-wise ``StatefulDataLoader`` handed out in any amount, across epochs.

    ``take(n)`` returns up to ``n`` inputs: first the buffered tail of the last loader batch, then
    whole or partial new loader batches. When the loader is exhausted the input epoch advances and a
    new pass starts, until ``total_epochs`` passes are done. The position of the stream is the loader
    state, the buffered tail, the input epoch and the number of loader batches taken in that epoch.

    ``load_state_dict`` is lazy for the loader part, like torchdata's ``StatefulDataLoader``: the
    loader state is applied when the stream next starts a loader pass.
    """

    def __init__(self, loader: Any, total_epochs: int) -> None:
        self._loader = loader
        self._total_epochs = int(total_epochs)
        self._iterator: Iterator[Batch] | None = None
        self._buffer: Batch | None = None
        self._epoch = 0
        self._batches_taken = 0

    @property
    def epoch(self) -> int:
        """The input epoch of the next input (0-based); equals ``total_epochs`` once exhausted."""
        return self._epoch

    @property
    def exhausted(self) -> bool:
        """True once all ``total_epochs`` passes over the loader have been handed out."""
        return self.remaining() == 0

    @property
    def buffered(self) -> int:
        """Number of inputs waiting in the buffer (taken from the loader, not yet handed out)."""
        return batch_len(self._buffer) if self._buffer else 0

    def remaining(self) -> int:
        """Inputs still to be handed out, counting the buffer and the loader batches not yet taken."""
        if self._epoch >= self._total_epochs:
            return self.buffered
        batches_per_epoch = len(self._loader)
        loader_batch = self._loader.batch_size
        left_in_epoch = max(0, batches_per_epoch - self._batches_taken)
        later_epochs = self._total_epochs - self._epoch - 1
        return self.buffered + (left_in_epoch + later_epochs * batches_per_epoch) * loader_batch

    def take(self, n: int) -> list[InputChunk]:
        """Hand out up to ``n`` inputs, grouped in chunks of one input epoch each, in stream order.

        Fewer than ``n`` inputs (possibly none) are returned only when the stream is exhausted.
        """
        chunks: list[InputChunk] = []
        needed = int(n)
        while needed > 0:
            if not self._buffer and not self._fetch():
                break
            assert self._buffer is not None
            size = batch_len(self._buffer)
            if needed >= size:
                head, self._buffer = self._buffer, None
            else:
                head, self._buffer = split_batch(self._buffer, needed)
            needed -= batch_len(head)
            if chunks and chunks[-1].epoch == self._epoch:
                chunks[-1] = InputChunk(concat_batches([chunks[-1].batch, head]), self._epoch)
            else:
                chunks.append(InputChunk(head, self._epoch))
        return chunks

    def _fetch(self) -> bool:
        """Move the next loader batch into the buffer; False when the stream is exhausted."""
        while self._epoch < self._total_epochs:
            if self._iterator is None:
                self._iterator = iter(self._loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                # A restored state saved right after an epoch's last batch yields an empty pass first:
                # that pass still belongs to the saved epoch, so counting it here is exactly right.
                self._iterator = None
                self._epoch += 1
                self._batches_taken = 0
                continue
            self._batches_taken += 1
            self._buffer = batch
            return True
        return False

    def restore_position(self, epoch: int, batches_taken: int) -> None:
        """Set the epoch counters for a checkpoint that has no input file (sync or legacy).

        The loader state, if any, must be loaded into the loader separately; the buffer is emptied.
        """
        self._iterator = None
        self._buffer = None
        self._epoch = int(epoch)
        self._batches_taken = int(batches_taken)

    def state_dict(self) -> dict[str, Any]:
        """The stream position: loader state, buffered tail (or None), input epoch, batches taken."""
        return {
            STATE_LOADER: self._loader.state_dict(),
            STATE_BUFFERED_TAIL: dict(self._buffer) if self._buffer else None,
            STATE_INPUT_EPOCH: self._epoch,
            STATE_BATCHES_TAKEN: self._batches_taken,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (the loader part is applied lazily)."""
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise KeyError(f"input stream state lacks {missing}")
        self._loader.load_state_dict(state[STATE_LOADER])
        self._iterator = None
        tail = state[STATE_BUFFERED_TAIL]
        self._buffer = dict(tail) if tail else None
        self._epoch = int(state[STATE_INPUT_EPOCH])
        self._batches_taken = int(state[STATE_BATCHES_TAKEN])
