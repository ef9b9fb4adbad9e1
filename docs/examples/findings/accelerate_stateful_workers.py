"""With ``num_workers > 0``, a shuffled Accelerate loader with ``use_stateful_dataloader=True`` and
``use_seedable_sampler=True`` resumes into the wrong order in its first epoch, and from the end of an
epoch into the order of the epoch after the next.

* Inside epoch 0: ``prepare()`` builds the loader and, with workers, its first iterator (the adapter
  takes a ``state_dict()`` at construction, huggingface/accelerate#4204) while the sampler is still the
  plain ``RandomSampler``; the ``SeedableRandomSampler`` replaces it afterwards. The uninterrupted run
  trains epoch 0 in the plain sampler's order; a resumed run fast-forwards the seedable sampler, whose
  order differs, so inputs are skipped and repeated.
* At the end of an epoch: resumed from a checkpoint taken after the epoch's last batch, the loader
  continues with epoch e + 2's order instead of e + 1's (the seedable sampler advances its own epoch
  once more while the loaded state is fast-forwarded).

With ``num_workers=0`` both resumes continue the uninterrupted order.

Run it: ``python accelerate_stateful_workers.py``. Each run is a new process. It prints the uninterrupted
and the resumed order for both kill points and both worker counts, and exits with status 1 while any
resume with workers differs (accelerate 1.15.0, torchdata 0.11), 0 once they all agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

EPOCHS, BATCHES_PER_EPOCH = 3, 3  # 10 inputs in batches of 4


def job(out: str, workers: int, save_after: int, resume: bool) -> list[list[int]]:
    """Train (here: take batches) for 3 epochs; save after ``save_after`` batches and stop, or resume from it."""
    set_seed(0)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True,
                                                                                  use_seedable_sampler=True))
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(10)), batch_size=4, shuffle=True,
                                                             num_workers=workers))
    taken, first_epoch = 0, 0
    if resume:
        accelerator.load_state(out)
        taken = save_after
        first_epoch = save_after // BATCHES_PER_EPOCH
    seen = []
    for epoch in range(first_epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            seen.append(batch.tolist())
            taken += 1
            if not resume and taken == save_after:
                accelerator.save_state(out)
                return seen
    return seen


def run(*args: object) -> list[list[int]]:
    done = subprocess.run([sys.executable, __file__, "job", *map(str, args)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    wrong = False
    for workers in (0, 2):
        for save_after, where in ((1, "after batch 1 of epoch 0"), (BATCHES_PER_EPOCH, "at the end of epoch 0")):
            with tempfile.TemporaryDirectory() as out:
                straight = run(out, workers, 0, 0)
                first = run(out, workers, save_after, 0)
                resumed = run(out, workers, save_after, 1)
            ok = first + resumed == straight
            wrong |= workers > 0 and not ok
            print(f"num_workers={workers}, resumed {where}: {'same order' if ok else 'DIFFERENT ORDER'}")
            print(f"  uninterrupted: {straight}")
            print(f"  killed+resumed: {first} | {resumed}")
    return 1 if wrong else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        out, workers, save_after, resume = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
        print(json.dumps(job(out, workers, save_after, resume)))
    else:
        sys.exit(main())
