"""Helpers for tests of the Agent Lightning trainer (shipped, so downstream tests can use them too).

* :class:`RecordingObserver` records every observer call of a run and can stop it abruptly
  (:class:`SimulatedKill`) at a chosen point; :func:`steps_for` counts the steps of an uninterrupted
  run by running it.
* :class:`TrainerWithoutInputFile` and :class:`TrainerWithoutCarryOver` are the trainer as it behaved
  before the async input fix and under format version 1's recovery limits. Tests that show the fix
  matters run them (``build_cpu_trainer(..., trainer_cls=...)``); the shipped trainer has no switch for
  either.

Nothing here is used by the trainer itself.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentlightning.verl.cpu_builder import build_cpu_trainer
from agentlightning.verl.input_file import write_input_state
from agentlightning.verl.rollout import LatencySpec
from agentlightning.verl.schedule import LatencyProfile
from agentlightning.verl.trainer import AgentLightningRayPPOTrainer

if TYPE_CHECKING:
    from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer


class TrainerWithoutInputFile(AgentLightningRayPPOTrainer):
    """The trainer before the async input fix: its checkpoints hold no input file, so a resume loses the
    buffered tail and guesses the epoch from the step (with a ``LegacyInputCheckpointWarning``)."""

    def _save_input_file(self, folder: str, step: int) -> None:
        pass


class TrainerWithoutCarryOver(AgentLightningRayPPOTrainer):
    """The trainer with format version 1's recovery limits: the input file records no in-flight groups
    and a resume resubmits none, so inputs in flight at the save are consumed but never trained on."""

    def _save_input_file(self, folder: str, step: int) -> None:
        write_input_state(folder, step, self.input_stream.state_dict(), None)  # None: an empty record

    def _restore_in_flight(self, carried_over: dict[str, Any]) -> None:
        pass


class SimulatedKill(Exception):
    """Raised by :class:`RecordingObserver` to stop ``fit()`` abruptly at a chosen point."""


@dataclass
class RecordingObserver:
    """An :class:`~agentlightning.verl.trainer.InputObserver` that records every event in order.

    It can also steer the run: ``checkpoint_steps`` asks for saves at those steps, and
    ``kill_at_step_end`` / ``kill_after_checkpoint`` raise :class:`SimulatedKill` at the end of (before
    any save of) or right after the published save of that step. Events are tuples
    ``(kind, step, epoch, ids)``; ``epoch`` and ``ids`` are None where they do not apply.
    """

    checkpoint_steps: set[int] = field(default_factory=set)
    kill_at_step_end: int | None = None
    kill_after_checkpoint: int | None = None
    events: list[tuple[str, int, int | None, Any]] = field(default_factory=list)
    resumed_step: int | None = None
    resumed_path: str | None = None

    def resumed(self, step: int, path: str | None) -> None:
        self.resumed_step, self.resumed_path = step, path
        self.events.append(("resumed", step, None, path))

    def consumed(self, ids: list[int], step: int, epoch: int) -> None:
        self.events.append(("consumed", step, epoch, list(ids)))

    def trained(self, ids: list[int], step: int, epoch: int) -> None:
        self.events.append(("trained", step, epoch, list(ids)))

    def step_end(self, step: int) -> None:
        self.events.append(("step_end", step, None, None))
        if step == self.kill_at_step_end:
            raise SimulatedKill(f"killed at the end of step {step}")

    def should_checkpoint(self, step: int) -> bool:
        return step in self.checkpoint_steps

    def checkpoint_published(self, step: int, path: str) -> None:
        self.events.append(("checkpoint", step, None, path))
        if step == self.kill_after_checkpoint:
            raise SimulatedKill(f"killed after the checkpoint of step {step}")

    def ledger(self, kind: str = "consumed", *, up_to_step: int | None = None) -> list[tuple[int, int]]:
        """``(epoch, input_id)`` pairs of ``kind`` events in order (only steps <= ``up_to_step`` if given)."""
        return [
            (epoch, input_id)
            for event, step, epoch, ids in self.events
            if event == kind and epoch is not None and (up_to_step is None or step <= up_to_step)
            for input_id in ids
        ]

    def steps(self) -> list[int]:
        """The steps that ended, in order."""
        return [step for event, step, _, _ in self.events if event == "step_end"]


class _StepCounter:
    def __init__(self) -> None:
        self.steps = 0

    def step_end(self, step: int) -> None:
        self.steps = max(self.steps, step)

    def __getattr__(self, name: str) -> Any:
        # The remaining observer calls are no-ops (should_checkpoint then answers None, i.e. no).
        return lambda *args: None


@functools.lru_cache(maxsize=64)
def _count_steps(key: tuple[tuple[str, Any], ...]) -> int:
    kwargs = dict(key)
    with tempfile.TemporaryDirectory(prefix="agentlightning-steps-") as output_dir:
        trainer = build_cpu_trainer(output_dir, resume_mode="disable", save_freq=-1, **kwargs)
        counter = _StepCounter()
        trainer.input_observer = counter
        trainer.fit()
    return counter.steps


def steps_for(
    *,
    async_enabled: bool = True,
    dataset_size: int = 24,
    train_batch_size: int = 4,
    async_train_batch_size: int = 6,
    total_epochs: int = 2,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    rollout_latency: LatencySpec = 1,
    latency_profile: LatencyProfile | None = None,
    trainer_cls: type[AgentLightningRayPPOTrainer | StockCpuRayPPOTrainer] = AgentLightningRayPPOTrainer,
) -> int:
    """Number of steps an uninterrupted :func:`build_cpu_trainer` run with these parameters takes.

    Computed by running that configuration once, uncheckpointed, in a temporary directory (a few
    tenths of a second on CPU), so it is exact for any latency and shuffle; results are cached.
    ``rollout_latency`` and ``latency_profile`` must be hashable (ints, tuples, module-level functions).
    """
    key = (
        ("async_enabled", async_enabled),
        ("dataset_size", dataset_size),
        ("train_batch_size", train_batch_size),
        ("async_train_batch_size", async_train_batch_size),
        ("total_epochs", total_epochs),
        ("shuffle", shuffle),
        ("seed", seed),
        ("num_workers", num_workers),
        ("rollout_latency", rollout_latency),
        ("latency_profile", latency_profile),
        ("trainer_cls", trainer_cls),
    )
    return _count_steps(key)
