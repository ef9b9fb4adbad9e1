"""torchdata's StatefulDataLoader over a StatefulDistributedSampler: a state_dict() taken after
load_state_dict() and before the next batch points at the start of the epoch, so a second resume
from it replays the batches the first run already trained on.

Run it: ``python torchdata_sampler_state_after_load.py``. It prints what an uninterrupted loader yields
after the first batch and what a twice-resumed one yields, and exits with status 1 while they differ
(torchdata 0.11), 0 once they agree.
"""

from __future__ import annotations

import sys
import warnings

from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

DATASET = list(range(12))
BATCH = 4
SEED = 1


def loader():
    sampler = StatefulDistributedSampler(DATASET, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    return StatefulDataLoader(DATASET, batch_size=BATCH, sampler=sampler)


def batches(dl):
    return [[int(i) for i in batch] for batch in dl]


def main() -> int:
    warnings.simplefilter("ignore")  # torchdata's own deprecation warning on every loader
    straight = batches(loader())

    # Run 1 trains on one batch and saves. Run 2 loads that state and saves again before it takes a
    # batch (a checkpoint at a step that used buffered inputs only). Run 3 resumes from run 2's state.
    first = loader()
    taken = next(iter(first))
    second = loader()
    second.load_state_dict(first.state_dict())
    third = loader()
    third.load_state_dict(second.state_dict())

    resumed = batches(third)
    print("uninterrupted, after the first batch:", straight[1:])
    print("resumed twice, after the first batch:", resumed)
    print("the first batch, trained by run 1:   ", [int(i) for i in taken])
    return 0 if resumed == straight[1:] else 1


if __name__ == "__main__":
    sys.exit(main())
