"""A CPU stand-in for verl's actor/rollout worker group, holding a real tiny torch model.

verl's trainer talks to its GPU workers through a worker group (``actor_rollout_wg``). On CPU this
module's :class:`CpuActorWorkerGroup` takes that place: it trains a small linear model with an Adam
optimizer on the inputs' features against the rollout rewards, and saves and loads model and
optimizer state under the ``actor`` folder verl asks for. Because the model is real, a resumed run can
be compared with an uninterrupted one on model state as well as on inputs.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from agentlightning.verl.durable import atomic_torch_save
from agentlightning.verl.inputs import Batch

ACTOR_STATE_FILENAME = "model.pt"
KEY_MODEL = "model"
KEY_OPTIMIZER = "optimizer"
KEY_UPDATES = "updates"
KEY_GLOBAL_STEP = "global_step"


class CpuActorWorkerGroup:
    """The worker-group calls verl's trainer makes (update, save, load), done in-process on CPU.

    ``update_actor`` takes a batch dict with a float ``features`` tensor of shape ``(n, feature_dim)``
    and a ``reward`` tensor of shape ``(n,)``; one optimizer step fits the model's output to the reward.
    """

    def __init__(
        self,
        feature_dim: int = 4,
        seed: int = 0,
        lr: float = 0.05,
        feature_key: str = "features",
        reward_key: str = "reward",
        filename: str = ACTOR_STATE_FILENAME,
    ) -> None:
        self.feature_key = feature_key
        self.reward_key = reward_key
        self.filename = filename  # in verl's actor folder (one per rank in the Ray worker group)
        # A private generator: model initialisation must not depend on (or disturb) global RNG state,
        # which the data loader's worker seeding also reads.
        generator = torch.Generator().manual_seed(int(seed))
        self.model = torch.nn.Linear(feature_dim, 1)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.updates = 0

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns metrics."""
        features = batch[self.feature_key].to(torch.float32)
        rewards = batch[self.reward_key].to(torch.float32)
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(features).squeeze(-1), rewards)
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return {"actor/loss": float(loss.detach()), "actor/batch_size": float(len(rewards))}

    def model_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the model parameters (for comparing runs)."""
        return {key: value.detach().clone() for key, value in self.model.state_dict().items()}

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint of this group holds: model and optimizer state dicts, update count."""
        return {KEY_MODEL: self.model.state_dict(), KEY_OPTIMIZER: self.optimizer.state_dict(),
                KEY_UPDATES: self.updates}

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ) -> None:
        """Save model, optimizer and update count into ``local_path`` (written atomically).

        ``hdfs_path`` and ``max_ckpt_to_keep`` are accepted for verl's call signature; the CPU group
        keeps every checkpoint locally.
        """
        state: dict[str, Any] = {
            KEY_MODEL: self.model.state_dict(),
            KEY_OPTIMIZER: self.optimizer.state_dict(),
            KEY_UPDATES: self.updates,
            KEY_GLOBAL_STEP: int(global_step),
        }
        atomic_torch_save(state, os.path.join(local_path, self.filename))

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Load what :meth:`save_checkpoint` wrote into ``local_path``."""
        path = os.path.join(local_path, self.filename)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path}: no actor checkpoint. The global_step folder is incomplete; resume from another "
                "one with trainer.resume_mode=resume_path trainer.resume_from_path=<folder>"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state[KEY_MODEL])
        self.optimizer.load_state_dict(state[KEY_OPTIMIZER])
        self.updates = int(state[KEY_UPDATES])
        if del_local_after_load:
            shutil.rmtree(local_path, ignore_errors=True)
