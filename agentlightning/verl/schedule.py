"""The async step schedule in pure Python: latency profiles and a simulation of the refill loop.

The resume-check matrix must know how many steps an uninterrupted run takes, and where its epochs end,
before it starts any run, and it must know it in the pytest process, which never imports torch or verl.
With rollouts that carry over, the step count depends on *which* inputs are slow and *when* they are
admitted. A latency drawn per input id would make it depend on the shuffle order, which only torch's
generator knows, and on the harness seed, which the matrix does not pass to its step function.

So the latency profiles here are functions of the *admission index*: the k-th input the trainer admits
in a run, counted across epochs (``epoch * inputs_per_epoch + position in that epoch's order``). The
CPU trainer maps each input id to its admission index through the real sampler's order
(:class:`agentlightning.verl.cpu_builder.AdmissionOrderLatency`), so the rollout engine still sees a
latency per (input id, epoch), while the schedule - steps, finishing steps, carried-over counts - is the same
for every shuffle and seed and is computed here exactly by :func:`simulate_async_schedule`.

This module imports neither torch nor verl.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: A latency profile: admission index -> steps the rollout of that input takes (at least 1).
LatencyProfile = Callable[[int], int]


def fast_latency(index: int) -> int:
    """Every rollout finishes in the step that submitted it: nothing carries over."""
    return 1


def mixed_latency(index: int) -> int:
    """One to three steps, drawn per admission index (str seeds hash identically in every process)."""
    return random.Random(f"mixed-latency:{index}").randint(1, 3)


def long_tail_latency(index: int) -> int:
    """Mostly one step; every fifth input (from the third on) takes four or five steps, so its group is
    carried over across several steps and several checkpoints."""
    if index % 5 == 2:
        return 4 + (index // 5) % 2
    return 1


#: Profiles by name (the ``latency`` case key of the resume-check target).
LATENCY_PROFILES: dict[str, LatencyProfile] = {
    "fast": fast_latency,
    "mixed": mixed_latency,
    "tail": long_tail_latency,
}


@dataclass(frozen=True)
class AsyncSchedule:
    """The uninterrupted async run of one configuration, input by input (indices are admission indices).

    ``admitted_at[k]`` and ``trained_at[k]`` are the steps that took and trained input ``k``; ``steps``
    is the number of steps (the step that trains the last admitted input).
    """

    inputs_per_epoch: int
    epochs: int
    admitted_at: tuple[int, ...]
    trained_at: tuple[int, ...]

    @property
    def steps(self) -> int:
        return max(self.trained_at, default=0)

    def carried_over_after(self, step: int) -> int:
        """Groups in flight at the end of ``step`` (admitted by then, trained later): what a checkpoint
        of ``step`` must carry over."""
        return sum(1 for a, t in zip(self.admitted_at, self.trained_at, strict=True) if a <= step < t)

    def admission_ends(self) -> list[int]:
        """For each epoch, the step that admits its last input (the loader starts its next pass after)."""
        per_epoch = self.inputs_per_epoch
        return [self.admitted_at[(e + 1) * per_epoch - 1] for e in range(self.epochs)] if per_epoch else []


def simulate_async_schedule(
    *,
    dataset_size: int,
    train_batch_size: int,
    async_train_batch_size: int,
    total_epochs: int,
    latency: LatencyProfile = fast_latency,
) -> AsyncSchedule:
    """The schedule of :meth:`AgentLightningRayPPOTrainer.fit` in async mode, step by step.

    Mirrors the trainer: the loader drops the last partial batch (as verl's train loader does); each
    step admits ``async_train_batch_size`` minus the groups in flight (never past ``total_epochs``),
    then trains on the rollouts that finish by its end (a rollout admitted in step ``s`` with latency
    ``L`` finishes at the end of step ``s + L - 1``); the run ends after the step that trains the last
    admitted input.
    """
    per_epoch = (dataset_size // train_batch_size) * train_batch_size
    total = per_epoch * total_epochs
    admitted_at: list[int] = []
    trained_at: dict[int, int] = {}
    in_flight: list[tuple[int, int]] = []  # (finishing step, admission index), in admission order
    step = 0
    while len(trained_at) < total:
        step += 1
        take = min(async_train_batch_size - len(in_flight), total - len(admitted_at))
        for index in range(len(admitted_at), len(admitted_at) + take):
            steps = int(latency(index))
            if steps < 1:
                raise ValueError(f"latency profile gave {steps} steps for admission index {index}; minimum is 1")
            in_flight.append((step + steps - 1, index))
            admitted_at.append(step)
        for finish, index in in_flight:
            if finish <= step:
                trained_at[index] = step
        in_flight = [(finish, index) for finish, index in in_flight if finish > step]
    return AsyncSchedule(per_epoch, total_epochs, tuple(admitted_at), tuple(trained_at[k] for k in range(total)))
