"""A data-parallel training loop on several ranks: ``torch.distributed`` with gloo on CPU, a tiny model
under ``DistributedDataParallel``, each rank's shard from a ``StatefulDistributedSampler``, and
checkpoints through ``torch.distributed.checkpoint`` (DCP). The bundled ``ddp_loop`` target runs it on
two ranks; ``bug=`` plants one of the mistakes distributed trainers make (see :data:`BUGS`).

What the correct loop does, and what the harness checks it for (docs/distributed.md):

- The checkpoint of step N is a folder ``step_N``: the model and optimizer through DCP (every rank takes
  part), each rank's torch generator (``rng_rank<r>.pt``: the loader draws its base seed from it when an
  epoch's iterator starts), then ``data.json`` (epoch, inputs of the epoch taken by all ranks together,
  step, world size) from rank 0, then - after a barrier, once every rank's files are durable - ``latest``
  names the folder. Written files are fsynced before their rename, and a resume requires every file the
  checkpoint's ranks wrote. With ``keep=`` rank 0 then deletes all but the last ``keep`` folders.
- The position is saved as a *global* count, so a resume at another world size (elastic) continues
  with the inputs no rank took yet: each new rank skips ``count / world size`` of its own shard of the
  same epoch's permutation (which needs the count to divide; it does at the matrix's elastic points).
- On SIGTERM every rank finishes its step, the ranks agree (all-reduce of a flag), save, publish, and
  stop: a preempted job loses nothing.

Importing this module imports nothing heavy; torch comes in inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from pytest_resume_check.integrations.durable import fsync_path

#: Inputs per epoch, epochs, inputs per rank and step: 12 divides by 1, 2 and 3 ranks.
N_INPUTS = 12
EPOCHS = 2
BATCH = 1
FEATURES = 4
LATEST = "latest"
DATA_FILE = "data.json"
#: Each rank's torch generator state, ``rng_rank<r>.pt``.
RNG_FILE = "rng_rank{rank}.pt"

#: Planted bugs: name -> what the trainer does wrong.
BUGS = {
    "sampler_rank0": "the sampler is saved from rank 0 only (pickled whole) and every rank loads it on resume",
    "stale_rank": "rank 1 resumes from the checkpoint before the newest where there is one (it distrusts the newest)",
    "elastic_epoch": "after a resume at another world size the resumed epoch is not set on the new sampler",
    "term_ignored": "the SIGTERM handler only logs: the job trains on until SIGKILL, saving nothing",
    "async_unawaited": ("the checkpoint is written with DCP's async_save and published before its future completes "
                        "(the background write starts only once publishing returned, so a kill at publication "
                        "always comes first, whatever the load)"),
    "restart_fresh": ("it looks for a checkpoint only when the job was started as a resume (run.is_resume): a "
                      "restart torchrun makes within the job has the same arguments, so it trains from the start"),
    "local_rank": ("the sampler's rank is LOCAL_RANK where it needs RANK: on one node they are equal, on two nodes "
                   "of one worker each both workers take the first shard"),
    "saved_world": ("a resumed sampler keeps the number of replicas the checkpoint was saved with, so after a node "
                    "is lost each remaining rank takes only its share of the old world"),
    "tracker_early": ("rank 0 names the new folder in latest as soon as its own files are durable, before the barrier "
                      "that waits for every rank's: a crash in between leaves latest naming a folder without "
                      "another rank's generator file"),
    "newest_folder": ("auto resume takes the newest step_N folder, whatever latest names: a crash inside a save "
                      "leaves a folder that is not complete on every rank"),
    "prune_early": ("keeping the last checkpoints (keep=), rank 0 deletes the older ones before latest names the new "
                    "one: a crash in between leaves latest naming a deleted folder"),
    "unsynced_rank1": ("rank 1 renames its generator file into place without fsyncing it first (rank 0 fsyncs every "
                       "file it writes, latest too): a power loss of rank 1's node after latest names the folder "
                       "leaves that file empty"),
    "async_prune": ("with an asynchronous save (asynchronous=True) latest names the new folder, and keep= deletes the "
                    "old one, before the save's future completed: a crash while the background write is in flight "
                    "leaves latest naming a folder without its metadata, and the old one gone"),
}


def total_steps(world_size: int) -> int:
    """Steps of an uninterrupted run on ``world_size`` ranks."""
    return EPOCHS * N_INPUTS // (BATCH * world_size)


def epoch_boundaries(world_size: int) -> list[int]:
    per_epoch = N_INPUTS // (BATCH * world_size)
    return [per_epoch * (e + 1) for e in range(EPOCHS)]


def train(run: Any, bug: str | None = None, keep: int | None = None, asynchronous: bool = False) -> None:
    """The loop on this rank (the harness starts one process per rank with ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set). ``keep``: only the last ``keep`` checkpoints stay (rank 0
    deletes the older ones once ``latest`` names the new one); all of them without it. ``asynchronous``: DCP
    writes the model and optimizer in a background thread (``async_save``, on a process group of its own) while
    the rank writes its other files, and the rank waits for it before ``latest`` names the folder."""
    import torch.distributed as dist

    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown planted bug {bug!r}; one of {sorted(BUGS)}")
    dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size, timeout=timedelta(seconds=60))
    try:
        loop = _Loop(run, bug, keep, asynchronous)
        loop.train()
        if loop.pending is not None:  # the last asynchronous save completes before the process group goes
            loop.pending.result()
    finally:
        dist.destroy_process_group()


class _Inputs:
    """Input i is (i, features that depend on i only)."""

    def __len__(self) -> int:
        return N_INPUTS

    def __getitem__(self, index: int) -> Any:
        import torch

        return index, torch.arange(FEATURES, dtype=torch.float32) * (index + 1) / (N_INPUTS * FEATURES)


class _Loop:
    def __init__(self, run: Any, bug: str | None, keep: int | None = None, asynchronous: bool = False):
        import torch
        from torch.nn.parallel import DistributedDataParallel

        self.run, self.bug, self.keep = run, bug, keep
        self.asynchronous = asynchronous or bug == "async_prune"
        self.rank, self.world = run.rank, run.world_size
        torch.manual_seed(run.seed)
        self.model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.dataset = _Inputs()
        self.shuffle = bool(run.case.get("shuffle", True))
        self.epoch, self.taken, self.step = 0, 0, 0  # taken: inputs of this epoch, all ranks together
        self.saved_world = self.world
        self.sampler: Any = None
        self.preempted = False
        self.pending: Any = None  # the async save in flight (the async_unawaited bug)
        self.rng: Any = None  # the torch generator's state a resume restores (set when the loop starts)
        # Async saves get a group of their own, as torch advises: the background write's collectives must
        # not meet the training step's on one group. The planted bug is only the unawaited future.
        self.save_group = _new_group() if bug == "async_unawaited" or self.asynchronous else None
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        if self.bug == "term_ignored":
            print(f"rank {self.rank}: SIGTERM received, going on", flush=True)
            return
        self.preempted = True

    # -- the loop ------------------------------------------------------------------------------------
    def train(self) -> None:
        from torch.utils.data import DataLoader, Dataset
        from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

        source = self._resume_source()
        if source is not None:
            self._load(source)
        self.run.resumed(self.step, source)  # what this rank restored
        if self.bug == "stale_rank" and self.run.is_resume:  # the step counter is rank 0's: ranks stay in step
            self.step = _from_rank0(self.step)
        if self.sampler is None:
            replicas = self.saved_world if self.bug == "saved_world" else self.world
            rank = int(os.environ["LOCAL_RANK"]) if self.bug == "local_rank" else self.rank
            self.sampler = StatefulDistributedSampler(self.dataset, num_replicas=replicas, rank=rank,
                                                      shuffle=self.shuffle, seed=self.run.seed)
        if self.taken >= N_INPUTS:  # saved at the epoch's last step
            self.epoch, self.taken = self.epoch + 1, 0
        resumed_epoch = self.epoch if source is not None else None
        # A map-style dataset by duck typing, as DataLoader takes one; typed as torch's Dataset, which it does
        # not subclass so that importing this module does not import torch.
        dataset = cast("Dataset[Any]", self.dataset)
        while self.epoch < EPOCHS:
            if not (self.bug == "elastic_epoch" and self.epoch == resumed_epoch and self.saved_world != self.world):
                self.sampler.set_epoch(self.epoch)
            if self.taken and self.bug != "sampler_rank0":
                if self.taken % self.world:
                    raise ValueError(f"the checkpoint's position ({self.taken} inputs of epoch {self.epoch}) does "
                                     f"not divide among {self.world} ranks; resume at a world size that divides it")
                self.sampler.load_state_dict({"yielded": self.taken // self.world})
            batches = DataLoader(dataset, batch_size=BATCH, sampler=self.sampler)
            if self.rng is not None and not self.taken:
                self._restore_rng()
            # Starting an iterator draws the loader's base seed from the torch generator. In the middle of
            # an epoch the uninterrupted run drew it at the epoch's start, which the saved state holds.
            loader_iter = iter(batches)
            if self.rng is not None:
                self._restore_rng()
            for ids, x in loader_iter:
                self.step += 1
                self.run.consumed(ids.tolist(), step=self.step, epoch=self.epoch)
                loss = self.model(x).pow(2).mean()
                self.optimizer.zero_grad()
                loss.backward()  # DDP all-reduces the gradients here
                self.optimizer.step()
                self.taken += BATCH * self.world
                self.run.step_end(self.step)
                self.run.state(self.step, {"model": self.model.module, "optimizer": self.optimizer})
                stop = self._agree(self.preempted)
                if self.run.should_checkpoint(self.step) or stop:
                    self._save()
                if stop:
                    return
            self.epoch, self.taken = self.epoch + 1, 0

    def _restore_rng(self) -> None:
        import torch

        torch.set_rng_state(self.rng)
        self.rng = None

    def _agree(self, flag: bool) -> bool:
        """Whether any rank was asked to stop (all ranks stop after the same step)."""
        import torch
        import torch.distributed as dist

        value = torch.tensor([1 if flag else 0])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    # -- checkpoints ---------------------------------------------------------------------------------
    def _save(self) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        folder = self.run.checkpoint_dir / f"step_{self.step}"
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        published = None
        if self.bug == "async_unawaited":
            if self.pending is not None:
                self.pending.result()
            published = threading.Event()
            self.pending = dcp.async_save({"model": model_state, "optim": optim_state},
                                          storage_writer=_gated_writer(folder, published),
                                          process_group=self.save_group)
        elif self.asynchronous:
            if self.pending is not None:  # the previous save's (async_prune publishes without waiting for it)
                self.pending.result()
            self.pending = dcp.async_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder),
                                          process_group=self.save_group)
        else:
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        _write_durably(folder / RNG_FILE.format(rank=self.rank), _pickled(torch.get_rng_state()),
                       sync=not (self.bug == "unsynced_rank1" and self.rank == 1))
        if self.rank == 0:
            data = {"epoch": self.epoch, "taken": self.taken, "step": self.step, "world_size": self.world}
            _write_durably(folder / DATA_FILE, json.dumps(data).encode())
            if self.bug == "sampler_rank0":
                _write_durably(folder / "sampler.pt", _pickled(self.sampler))
        if self.rank == 0 and self.bug == "tracker_early":
            _write_durably(self.run.checkpoint_dir / LATEST, folder.name.encode())
        if self.asynchronous and self.bug != "async_prune":
            self.pending.result()  # the background write is complete before any rank names the folder
            self.pending = None
        dist.barrier()  # every rank's files are durable
        if self.rank == 0 and self.bug == "prune_early":
            self._prune(folder)
        if self.rank == 0 and self.bug != "tracker_early":
            _write_durably(self.run.checkpoint_dir / LATEST, folder.name.encode())
        if self.rank == 0 and self.bug != "prune_early":
            self._prune(folder)
        dist.barrier()
        self.run.checkpoint_published(self.step, folder)
        if published is not None:
            published.set()

    def _prune(self, newest: Path) -> None:
        """Keep the last ``keep`` checkpoints, ``newest`` the last of them (nothing without ``keep``)."""
        if self.keep is None:
            return
        saved = sorted((p for p in self.run.checkpoint_dir.glob("step_*") if p.is_dir() and p != newest),
                       key=lambda p: int(p.name[5:]))
        for old in saved[:max(0, len(saved) - (self.keep - 1))]:
            shutil.rmtree(old)

    def _resume_source(self) -> Path | None:
        run = self.run
        if run.resume_mode == "disabled":
            return None
        if run.resume_mode == "path":
            return run.resume_path
        latest = run.checkpoint_dir / LATEST
        if not latest.exists() or (self.bug == "restart_fresh" and not run.is_resume):
            return None
        if self.bug == "newest_folder":
            return max(run.checkpoint_dir.glob("step_*"), key=lambda p: int(p.name[5:]))
        if self.bug == "stale_rank" and self.rank == 1:
            older = sorted((p for p in run.checkpoint_dir.glob("step_*") if (p / DATA_FILE).exists()),
                           key=lambda p: int(p.name[5:]))[:-1]
            return older[-1] if older else run.checkpoint_dir / latest.read_text().strip()
        return run.checkpoint_dir / latest.read_text().strip()

    def _load(self, folder: Path) -> None:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        data = json.loads((folder / DATA_FILE).read_text())
        self.epoch, self.taken, self.step = int(data["epoch"]), int(data["taken"]), int(data["step"])
        self.saved_world = int(data["world_size"])
        if self.rank < self.saved_world:  # a rank that joined at a larger world size keeps its seeded generator
            self.rng = torch.load(folder / RNG_FILE.format(rank=self.rank), weights_only=True)
        if self.bug == "sampler_rank0":
            self.sampler = torch.load(folder / "sampler.pt", weights_only=False)
            self.sampler.load_state_dict({"yielded": self.sampler.yielded})


def _new_group() -> Any:
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


def _gated_writer(folder: Path, gate: threading.Event) -> Any:
    """DCP's file writer, whose writing waits for ``gate``: the async_unawaited bug's background write starts
    only after the checkpoint was published, so the planted race always goes the same way (under
    load the write sometimes won, and the bug was missed)."""
    from torch.distributed.checkpoint import FileSystemWriter

    class GatedWriter(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            gate.wait()
            return super().write_data(plan, planner)

    return GatedWriter(str(folder))


def _from_rank0(number: int) -> int:
    import torch
    import torch.distributed as dist

    value = torch.tensor([number])
    dist.broadcast(value, src=0)
    return int(value.item())


def _pickled(value: Any) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _write_durably(path: Path, data: bytes, sync: bool = True) -> None:
    """Write to a temporary name, fsync (unless not ``sync``: a planted bug), rename over ``path``, fsync the
    folder."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def correct_ddp(run: Any) -> None:
    """The loop without a planted bug."""
    train(run)


def warm_up() -> None:
    """Pay torch.distributed's and DCP's first-use costs once in the fork server (no threads, no group):
    ``DistributedDataParallel`` imports ``torch._dynamo`` when first built (0.9 s a run otherwise)."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler  # noqa: F401
