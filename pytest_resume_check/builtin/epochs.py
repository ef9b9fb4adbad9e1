"""Step counts of the integration examples' cases: ``n`` inputs per epoch in loader batches of ``batch``,
one optimizer step per ``accumulation`` batches, and a step on an epoch's last batch even when the
accumulation is not full (Lightning, Accelerate and the Transformers ``Trainer`` all do so)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class AccumulatedEpochs:
    """The step functions a target needs (:meth:`total_steps`, :meth:`epoch_boundaries`) for cases with
    ``defaults`` filled in, the accumulation read from the case key ``accumulation``."""

    def __init__(self, defaults: Mapping[str, Any], accumulation: str):
        self.defaults = dict(defaults)
        self.accumulation = accumulation

    def params(self, case: Mapping[str, Any]) -> dict[str, Any]:
        """The case with defaults filled in."""
        return {**self.defaults, **{k: v for k, v in case.items() if k != "id"}}

    def steps_per_epoch(self, case: Mapping[str, Any]) -> int:
        """Optimizer steps of one epoch (the last batch may be short, its accumulation partial)."""
        p = self.params(case)
        return math.ceil(math.ceil(p["n"] / p["batch"]) / p[self.accumulation])

    def total_steps(self, case: Mapping[str, Any]) -> int:
        """Optimizer steps of an uninterrupted run."""
        return self.steps_per_epoch(case) * self.params(case)["epochs"]

    def epoch_boundaries(self, case: Mapping[str, Any]) -> list[int]:
        """The optimizer steps that take an epoch's last batch."""
        per_epoch = self.steps_per_epoch(case)
        return [per_epoch * e for e in range(1, self.params(case)["epochs"] + 1)]
