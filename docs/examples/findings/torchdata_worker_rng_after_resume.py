"""torchdata's StatefulDataLoader with worker processes: a loader resumed from a state_dict() taken in
the middle of an epoch yields the right samples, but its workers start their generators again as at the
epoch's start, so randomness a worker draws per sample (noise, augmentation) repeats the epoch's first
draws instead of continuing them.

Run it: ``python torchdata_worker_rng_after_resume.py``. It prints the ids and the noise (``torch.rand``
in the worker, rounded to 4 decimals) that an uninterrupted loader with 2 workers yields after its third
batch and those a loader resumed from the state_dict() taken there yields, then the noise of the first
three batches, and exits with status 1 while the two differ (torchdata 0.11), 0 once they agree.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

SIZE = 12
BATCH = 2
WORKERS = 2
TAKEN = 3  # batches taken before the state_dict()
SEED = 1


class Noisy:
    """Sample i: its id and noise drawn in the worker that loads it (module level, so workers can use it)."""

    def __len__(self):
        return SIZE

    def __getitem__(self, index):
        return {"id": index, "noise": torch.rand(())}


def loader():
    return StatefulDataLoader(Noisy(), batch_size=BATCH, num_workers=WORKERS)


def plain(batch):
    return [int(i) for i in batch["id"]], [round(float(x), 4) for x in batch["noise"]]


def main() -> int:
    warnings.simplefilter("ignore")  # torchdata's own deprecation warning on every loader
    torch.manual_seed(SEED)  # the loader draws its workers' base seed from the global generator
    straight, state = [], None
    uninterrupted = loader()
    for batch in uninterrupted:
        straight.append(plain(batch))
        if len(straight) == TAKEN:
            state = uninterrupted.state_dict()  # a checkpoint after the third batch

    resumed_loader = loader()
    resumed_loader.load_state_dict(state)
    resumed = [plain(batch) for batch in resumed_loader]

    after = straight[TAKEN:]
    print(f"uninterrupted, ids after batch {TAKEN}:   ", [ids for ids, _ in after])
    print(f"resumed,       ids after batch {TAKEN}:   ", [ids for ids, _ in resumed])
    print(f"uninterrupted, noise after batch {TAKEN}: ", [noise for _, noise in after])
    print(f"resumed,       noise after batch {TAKEN}: ", [noise for _, noise in resumed])
    print(f"uninterrupted, noise of batches 1-{TAKEN}:", [noise for _, noise in straight[:TAKEN]])
    return 0 if resumed == after else 1


if __name__ == "__main__":
    sys.exit(main())
