"""VERL integration: :class:`AgentLightningRayPPOTrainer`, its CPU embedded defaults and test helpers.

The public names are loaded lazily (module ``__getattr__``): ``import agentlightning.verl`` stays
cheap and imports neither torch nor verl until a name below is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlightning.verl.cpu_builder import build_cpu_trainer
    from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer
    from agentlightning.verl.testing import RecordingObserver, SimulatedKill, steps_for
    from agentlightning.verl.trainer import AgentLightningRayPPOTrainer, InputObserver

# Public name -> module that defines it.
_LAZY_NAMES = {
    "AgentLightningRayPPOTrainer": "agentlightning.verl.trainer",
    "InputObserver": "agentlightning.verl.trainer",
    "RecordingObserver": "agentlightning.verl.testing",
    "SimulatedKill": "agentlightning.verl.testing",
    "StockCpuRayPPOTrainer": "agentlightning.verl.stock_trainer",
    "build_cpu_trainer": "agentlightning.verl.cpu_builder",
    "steps_for": "agentlightning.verl.testing",
}

__all__ = [
    "AgentLightningRayPPOTrainer",
    "InputObserver",
    "RecordingObserver",
    "SimulatedKill",
    "StockCpuRayPPOTrainer",
    "build_cpu_trainer",
    "steps_for",
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
