"""Rollout engines: what turns taken inputs into rewarded rollouts, possibly over several steps.

:class:`RolloutEngine` is the protocol the trainer drives. :class:`DeterministicRolloutEngine` is the
CPU embedded default: each input's rollout takes a fixed, seeded number of trainer steps, so with a
latency above one, rollouts submitted in one step finish in a later one (they "carry over"), as
agent rollouts do in async training. Rewards are a seeded function of the input, so every run of the
same configuration produces the same rollouts.

An engine's own state is not checkpointed (an external rollout server's cannot be). Instead the trainer
records the original row of every in-flight input (:mod:`agentlightning.verl.inflight`); a resume calls
:meth:`RolloutEngine.reset` and then resubmits those rows, in their original order and with the step
they were first submitted in, before it takes any new input. The deterministic engine derives a
rollout's finishing step from that submission step, so resubmitted rollouts finish exactly when they
would have in the uninterrupted run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from agentlightning.verl.inputs import Batch, concat_batches, select_rows

# A latency is a constant number of steps, an inclusive (low, high) range drawn per input from the
# seed, or a function of (input_id, input_epoch).
LatencySpec = int | tuple[int, int] | Callable[[int, int], int]
# A per-rollout transformation of one input row (a batch of one input), applied at submission.
RowTransform = Callable[[Batch], Batch]

REWARD_KEY = "reward"


@dataclass
class CompletedRollouts:
    """Rollouts finished in one step: the inputs' batch (with rewards), their ids and input epochs."""

    batch: Batch
    ids: list[int]
    epochs: list[int]

    def by_epoch(self) -> list[tuple[int, list[int]]]:
        """Ids grouped into runs of consecutive inputs with the same epoch, in order."""
        return group_ids_by_epoch(self.ids, self.epochs)


def group_ids_by_epoch(ids: list[int], epochs: list[int]) -> list[tuple[int, list[int]]]:
    """``[(epoch, ids), ...]`` for each run of consecutive ids that share an epoch, in order."""
    groups: list[tuple[int, list[int]]] = []
    for input_id, epoch in zip(ids, epochs, strict=True):
        if groups and groups[-1][0] == epoch:
            groups[-1][1].append(input_id)
        else:
            groups.append((epoch, [input_id]))
    return groups


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine.

    The trainer submits every input it takes from the input stream, then collects the rollouts that
    are ready (async) or drains all of them (sync) and trains on those.
    """

    def submit(self, batch: Batch, ids: list[int], epoch: int, step: int) -> None:
        """Start rollouts for the inputs of ``batch`` (ids ``ids``, input epoch ``epoch``).

        ``step`` is the step the inputs were first submitted in: the current step for new inputs, the
        original step for inputs a resume resubmits. ``batch`` holds the inputs as taken from the input
        stream; the engine must not modify it in place.
        """

    def collect(self, step: int) -> CompletedRollouts | None:
        """Rollouts that have finished by the end of ``step``, in submission order; None if none."""

    def drain(self, step: int) -> CompletedRollouts | None:
        """Wait for every in-flight rollout and return them all, in submission order."""

    def in_flight(self) -> int:
        """Number of submitted rollouts not yet returned by ``collect``/``drain``."""

    def reset(self) -> None:
        """Drop all in-flight rollouts (a resume then resubmits the ones its checkpoint recorded)."""


@dataclass
class _Pending:
    input_id: int
    epoch: int
    ready_step: int
    row: Batch


class DeterministicRolloutEngine:
    """A seeded CPU rollout engine whose per-input latency is counted in trainer steps.

    A rollout submitted in step ``s`` with latency ``k >= 1`` is ready at the end of step ``s + k - 1``.
    Its reward is drawn from ``seed``, the input id and the input epoch only, so it does not depend on
    batching, timing or on whether the run was resumed. ``transform``, if given, is applied to each
    input row at submission (as a real engine templates a prompt or repeats an input for a group); the
    rollouts it returns carry the transformed rows.
    """

    def __init__(
        self,
        seed: int = 0,
        latency: LatencySpec = 1,
        reward_key: str = REWARD_KEY,
        transform: RowTransform | None = None,
    ) -> None:
        self.seed = int(seed)
        self.latency = latency
        self.reward_key = reward_key
        self.transform = transform
        self._pending: list[_Pending] = []
        _ = self.latency_of(0, 0)  # reject a bad latency spec at construction, not mid-run

    def latency_of(self, input_id: int, epoch: int) -> int:
        """Steps the rollout of ``input_id`` in input epoch ``epoch`` takes (at least 1)."""
        spec = self.latency
        if callable(spec):
            value = spec(input_id, epoch)
        elif isinstance(spec, tuple):
            low, high = spec
            # str seeds hash with sha512 inside random.Random: identical in every process.
            value = random.Random(f"latency:{self.seed}:{epoch}:{input_id}").randint(low, high)
        else:
            value = spec
        if int(value) < 1:
            raise ValueError(f"rollout latency must be at least 1 step, got {value!r} for input {input_id}")
        return int(value)

    def reward_of(self, input_id: int, epoch: int) -> float:
        """The deterministic reward of the rollout of ``input_id`` in input epoch ``epoch``."""
        return random.Random(f"reward:{self.seed}:{epoch}:{input_id}").uniform(-1.0, 1.0)

    def submit(self, batch: Batch, ids: list[int], epoch: int, step: int) -> None:
        """Start one rollout per input of ``batch``."""
        for row, input_id in enumerate(ids):
            ready = step + self.latency_of(input_id, epoch) - 1
            rollout_input = select_rows(batch, [row])
            if self.transform is not None:
                rollout_input = self.transform(rollout_input)
            self._pending.append(_Pending(input_id, epoch, ready, rollout_input))

    def collect(self, step: int) -> CompletedRollouts | None:
        """Rollouts ready by the end of ``step``; the others stay in flight."""
        ready = [p for p in self._pending if p.ready_step <= step]
        self._pending = [p for p in self._pending if p.ready_step > step]
        return self._complete(ready)

    def drain(self, step: int) -> CompletedRollouts | None:
        """All in-flight rollouts, ready or not (sync training waits for every rollout)."""
        ready, self._pending = self._pending, []
        return self._complete(ready)

    def in_flight(self) -> int:
        """Number of rollouts submitted and not yet returned."""
        return len(self._pending)

    def reset(self) -> None:
        """Forget all in-flight rollouts."""
        self._pending = []

    def _complete(self, ready: list[_Pending]) -> CompletedRollouts | None:
        if not ready:
            return None
        batch: dict[str, Any] = concat_batches([p.row for p in ready])
        rewards = [self.reward_of(p.input_id, p.epoch) for p in ready]
        batch[self.reward_key] = torch.tensor(rewards, dtype=torch.float32)
        return CompletedRollouts(batch, [p.input_id for p in ready], [p.epoch for p in ready])
