"""torchdata's StatefulDataLoader(shuffle=True, generator=g), resumed in the middle of epoch 0, shuffles
epoch 1 differently from a run that was never interrupted.

Run it: ``python torchdata_shared_generator.py``. It prints both orders of epoch 1 and exits with
status 1 while the two differ (torchdata 0.11), 0 once they agree.
"""

from __future__ import annotations

import sys

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

DATASET = list(range(8))
BATCH = 2
SEED = 1234


def loader():
    generator = torch.Generator()
    generator.manual_seed(SEED)
    return StatefulDataLoader(DATASET, batch_size=BATCH, shuffle=True, generator=generator)


def flat(batches):
    return [int(i) for batch in batches for i in batch]


def main() -> int:
    # Uninterrupted: two epochs.
    straight = loader()
    list(straight)
    epoch1_straight = flat(straight)

    # Interrupted: one batch of epoch 0, save, and resume in a new loader (a new process would do the same).
    first = loader()
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    list(resumed)  # the rest of epoch 0
    epoch1_resumed = flat(resumed)

    print("epoch 1, uninterrupted:", epoch1_straight)
    print("epoch 1, resumed:      ", epoch1_resumed)
    return 0 if epoch1_resumed == epoch1_straight else 1


if __name__ == "__main__":
    sys.exit(main())
