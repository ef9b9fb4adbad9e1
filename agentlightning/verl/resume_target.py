"""The Agent Lightning VERL trainer as resume-check targets (the only module that imports the harness).

Three targets, registered through the ``pytest_resume_check.targets`` entry point:

* ``agentlightning_async`` - async refills that split loader batches, with rollout latency profiles
  (all fast; mixed; long tails) that carry groups over across checkpoint steps; contract exactly-once,
  same order, on both the consumed and the trained ledger. Every cell must pass.
* ``agentlightning_sync`` - the same trainer in sync mode (verl's checkpoint format), both ledgers.
* ``verl_stock_sync`` - stock ``RayPPOTrainer`` save/load driven the same way on CPU. Its known
  failures are declared as expected failures with the reason, so the matrix documents them.

verl is imported only inside the child processes (and the fork server, through ``preload``): loading
this module costs nothing. The async step counts come from the pure-Python schedule simulation of
:mod:`agentlightning.verl.schedule`, whose latency profiles are keyed on the admission order so the
count is exact for every shuffle and seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentlightning.verl.schedule import LATENCY_PROFILES, AsyncSchedule, simulate_async_schedule
from agentlightning.verl.verl_layout import DATALOADER_FILENAME, TRACKER_FILENAME
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext
from pytest_resume_check.targets import Contract, resume_target

if TYPE_CHECKING:  # verl only inside the functions (see above)
    from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer
    from agentlightning.verl.trainer import AgentLightningRayPPOTrainer

#: Case keys: ``n`` dataset size, ``batch`` (data.train_batch_size), ``refill``
#: (agentlightning.async_rollout.async_train_batch_size), ``epochs``, ``shuffle``, ``workers``,
#: ``latency`` (a profile name of agentlightning.verl.schedule.LATENCY_PROFILES; async only).
DEFAULTS = {"n": 24, "batch": 4, "refill": 6, "epochs": 2, "shuffle": False, "workers": 0, "latency": "fast"}

#: Loader batch vs refill: 6 and 5 do not divide into batches of 4, 8 does, 10 spans three batches.
ASYNC_CASES = (
    {"id": "b4-r6-e2-fast", "refill": 6},
    {"id": "b4-r6-e2-mixed", "refill": 6, "latency": "mixed"},
    {"id": "b4-r8-e2-shuffle-tail", "refill": 8, "shuffle": True, "latency": "tail"},
    {"id": "b4-r10-e2-shuffle-mixed", "refill": 10, "shuffle": True, "latency": "mixed"},
    {"id": "b4-r5-e1-tail", "refill": 5, "epochs": 1, "latency": "tail"},
    {"id": "n12-b4-r6-e2-shuffle-w2-tail", "n": 12, "refill": 6, "shuffle": True, "workers": 2, "latency": "tail"},
)
SYNC_CASES = (
    {"id": "b4-e2", "n": 16},
    {"id": "b4-e2-shuffle", "n": 16, "shuffle": True},
)

_VERL_MODES = {RESUME_AUTO: "auto", RESUME_PATH: "resume_path", RESUME_DISABLED: "disable"}
PRELOAD = ("torch", "verl.trainer.ppo.ray_trainer", "agentlightning.verl.cpu_builder",
           "agentlightning.verl.stock_trainer", "agentlightning.verl.resume_target:warm_up")


def params(case: Mapping[str, Any]) -> dict[str, Any]:
    """The case with defaults filled in."""
    return {**DEFAULTS, **{k: v for k, v in case.items() if k != "id"}}


def async_schedule(case: Mapping[str, Any]) -> AsyncSchedule:
    """The uninterrupted async run of a case, simulated in pure Python (no torch, no verl)."""
    p = params(case)
    return simulate_async_schedule(
        dataset_size=p["n"],
        train_batch_size=p["batch"],
        async_train_batch_size=p["refill"],
        total_epochs=p["epochs"],
        latency=LATENCY_PROFILES[p["latency"]],
    )


def async_steps(case: Mapping[str, Any]) -> int:
    """Steps of an uninterrupted async run: until the step that trains the last admitted input."""
    return async_schedule(case).steps


def async_boundaries(case: Mapping[str, Any]) -> list[int]:
    """The steps that admit the last input of an epoch (the loader starts its next pass after them)."""
    return async_schedule(case).admission_ends()


def sync_steps(case: Mapping[str, Any]) -> int:
    p = params(case)
    return (p["n"] // p["batch"]) * p["epochs"]


def sync_boundaries(case: Mapping[str, Any]) -> list[int]:
    p = params(case)
    return [(p["n"] // p["batch"]) * e for e in range(1, p["epochs"] + 1)]


class RunObserver:
    """Adapts the trainer's ``InputObserver`` calls to the harness's run context, and reports the
    trainer's state by component after each step (:func:`trainer_state`), so a resume that restores
    part of it wrongly fails naming the part, and a resumed run whose state equals the reference's
    stops early.

    The state is reported once per step, when it is final: after ``step_end`` when no checkpoint
    follows, else after ``checkpoint_published`` (the early stop must not end a run before the save
    the harness asked for); and once right after a resume restored step k, as step k's."""

    def __init__(self, run: RunContext, trainer: Any = None):
        self.run = run
        self.trainer = trainer

    def resumed(self, step: int, path: str | None) -> None:
        self.run.resumed(step, path)
        if step:  # the trainer has restored its checkpoint: compared with the reference's state at that step
            self._report_state(step)

    def consumed(self, ids: list[int], step: int, epoch: int) -> None:
        self.run.consumed(ids, step=step, epoch=epoch)

    def trained(self, ids: list[int], step: int, epoch: int) -> None:
        self.run.trained(ids, step=step, epoch=epoch)

    def step_end(self, step: int) -> None:
        self.run.step_end(step)
        if not self.run.should_checkpoint(step):
            self._report_state(step)

    def should_checkpoint(self, step: int) -> bool:
        return self.run.should_checkpoint(step)

    def checkpoint_published(self, step: int, path: str) -> None:
        self.run.checkpoint_published(step, path)
        self._report_state(step)

    def _report_state(self, step: int) -> None:
        state = trainer_state(self.trainer)
        if state is not None:
            self.run.state(step, state)


def trainer_state(trainer: Any) -> dict[str, Any] | None:
    """The state that decides the rest of a run, by component (None without a trainer).

    Both trainers: ``model`` and ``optimizer`` (the CPU worker group's torch model and Adam state),
    ``updates`` (the worker's update count, saved with them) and ``step`` (``global_steps``). The Agent
    Lightning trainer adds ``inputs`` (the input stream's position: loader state, buffered tail, input
    epoch, loader batches taken), ``in_flight`` (the record of inputs whose rollouts are running, which
    its checkpoint holds) and ``pending`` (the rollouts the engine holds, with the step each is ready
    in); stock verl adds ``loader`` (see :func:`stock_state`).
    """
    if trainer is None:
        return None
    state: dict[str, Any] = dict(trainer.actor_rollout_wg.checkpoint_state())  # from rank 0 on Ray workers
    if hasattr(trainer, "input_stream"):
        state.update({
            "inputs": trainer.input_stream.state_dict(),
            "in_flight": trainer.in_flight_inputs.state_dict(),
            "pending": pending_rollouts(trainer.rollout_engine),
        })
    else:
        state.update(stock_state(trainer))
    state["step"] = trainer.global_steps
    return state


def pending_rollouts(engine: Any) -> list[dict[str, Any]]:
    """The rollouts in flight in the CPU engine, in submission order: id, input epoch, the step that
    finishes each, and the row it was submitted with (what the update will train on)."""
    return [{"input_id": p.input_id, "epoch": p.epoch, "ready_step": p.ready_step, "row": p.row}
            for p in getattr(engine, "_pending", ())]


def stock_state(trainer: Any) -> dict[str, Any]:
    """What of stock verl's state is reachable from outside its ``fit``: the loader (``data.pt``).

    Not reported: the epoch. ``RayPPOTrainer.fit`` keeps it in a local (``for epoch in range(...)``,
    started at ``global_steps // len(train_dataloader)`` after loading), which no observer call can
    read; a wrong epoch shows in the ledger's epoch labels instead. The rollout record and the
    engine's pending rollouts are always empty after a sync step (each step drains every rollout it
    submitted), so they are left out too.
    """
    return {"loader": trainer.train_dataloader.state_dict()}


def fit_trainer(run: RunContext, *, async_enabled: bool,
                trainer_cls: type[AgentLightningRayPPOTrainer | StockCpuRayPPOTrainer] | None = None,
                ray_workers: int = 0) -> None:
    """Build the CPU trainer of ``run.case`` (``trainer_cls``, by default the Agent Lightning trainer)
    and train it under the harness; ``ray_workers``: its actor on that many Ray actors (0: in-process)."""
    from agentlightning.verl.cpu_builder import build_cpu_trainer
    from agentlightning.verl.trainer import AgentLightningRayPPOTrainer

    p = params(run.case)
    trainer = build_cpu_trainer(
        str(run.checkpoint_dir),
        async_enabled=async_enabled,
        dataset_size=p["n"],
        train_batch_size=p["batch"],
        async_train_batch_size=p["refill"],
        total_epochs=p["epochs"],
        shuffle=bool(p["shuffle"]),
        seed=run.seed,
        num_workers=int(p["workers"]),
        resume_mode=_VERL_MODES[run.resume_mode],
        resume_from_path=str(run.resume_path) if run.resume_path else None,
        latency_profile=LATENCY_PROFILES[p["latency"]] if async_enabled else None,
        trainer_cls=trainer_cls or AgentLightningRayPPOTrainer,
        ray_workers=ray_workers,
    )
    trainer.input_observer = RunObserver(run, trainer)
    trainer.fit()


def fit_async(run: RunContext) -> None:
    """AgentLightningRayPPOTrainer, async refills."""
    fit_trainer(run, async_enabled=True)


def fit_sync(run: RunContext) -> None:
    """AgentLightningRayPPOTrainer, sync mode (verl's checkpoint format)."""
    fit_trainer(run, async_enabled=False)


def fit_stock(run: RunContext) -> None:
    """Stock verl RayPPOTrainer save/load, driven on CPU."""
    from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer

    fit_trainer(run, async_enabled=False, trainer_cls=StockCpuRayPPOTrainer)


def is_async(case: Mapping[str, Any]) -> bool:
    """A Ray case's mode (``"mode": "async"`` or ``"sync"``)."""
    return case.get("mode", "async") == "async"


def ray_steps(case: Mapping[str, Any]) -> int:
    return async_steps(case) if is_async(case) else sync_steps(case)


def ray_boundaries(case: Mapping[str, Any]) -> list[int]:
    return async_boundaries(case) if is_async(case) else sync_boundaries(case)


def fit_ray(run: RunContext) -> None:
    """AgentLightningRayPPOTrainer with its actor on verl's RayWorkerGroup of Ray actors, async or sync by case."""
    fit_trainer(run, async_enabled=is_async(run.case), ray_workers=RAY_WORKERS)


def warm_up() -> None:
    """One short run in the fork server, so children start with verl and torch initialised (the
    harness then freezes the server's heap for the garbage collector)."""
    import tempfile

    from agentlightning.verl.cpu_builder import build_cpu_trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_cpu_trainer(tmp, dataset_size=8, total_epochs=1, resume_mode="disable", save_freq=1)
        trainer.fit()


def _stock_replays_epoch(cell: Any) -> bool:
    """verl 0.8/0.9 skip data.pt when global_steps % len(loader) == 0: a resume from a checkpoint at
    the end of an epoch restarts the loader, which with shuffle replays the first epoch's order. Without
    shuffle the inputs come out right, but the restored loader state is not the checkpoint's (compared
    at the restored step), also in a resume from the last step."""
    per_epoch = params(cell.case)["n"] // params(cell.case)["batch"]
    return any(k.checkpoint_step and k.checkpoint_step % per_epoch == 0 for k in cell.kills)


def _stock_tracker_lost(cell: Any) -> bool:
    """verl writes its tracker with a plain open("w"), no fsync: after a kill between that open and
    the close, a power loss once it was opened, an I/O error while writing it, or a torn copy of a
    file it never made durable, the next resume reads an empty tracker and fails on int("")."""
    fault = cell.kills[0].fault if cell.kills else None
    tracker = [op.index for op in cell.save_ops if op.path == TRACKER_FILENAME]
    if fault is None or not tracker:
        return False
    opened, closed = tracker[0], tracker[-1]
    if fault.mode == "torn":
        return fault.file == TRACKER_FILENAME  # a torn data.pt is never read: the tracker still names the old step
    if fault.mode == "power":
        return fault.op > opened
    return opened < fault.op <= closed


#: Exactly-once, same order, on what was taken from the loader and on what was trained on.
BOTH_LEDGERS = Contract(ordered=True, ledgers=("consumed", "trained"))

#: The Agent Lightning VERL trainer, async refills with carried-over rollouts (the fixed trainer).
agentlightning_async = resume_target(
    fit_async, name="agentlightning_async", steps=async_steps, boundaries=async_boundaries,
    cases=ASYNC_CASES, contract=BOTH_LEDGERS, preload=PRELOAD, crash_save=(2, 1),
)
#: The Agent Lightning VERL trainer, sync mode.
agentlightning_sync = resume_target(
    fit_sync, name="agentlightning_sync", steps=sync_steps, boundaries=sync_boundaries,
    cases=SYNC_CASES, contract=BOTH_LEDGERS, preload=PRELOAD, crash_save=(2, 1),
)
#: Stock verl's RayPPOTrainer checkpointing on CPU.
verl_stock_sync = resume_target(
    fit_stock, name="verl_stock_sync", steps=sync_steps, boundaries=sync_boundaries,
    cases=SYNC_CASES, contract="exactly_once_ordered", preload=PRELOAD, crash_save=(2, 1),
    expected_failures=[(_stock_replays_epoch,
                        f"verl skips {DATALOADER_FILENAME} at global_steps % len(loader) == 0: the loader "
                        "state is not restored, and with shuffle epoch 0's order replays"),
                       (_stock_tracker_lost,
                        f"verl writes {TRACKER_FILENAME} with open('w') and no fsync: "
                        "left empty by the fault, the next resume fails on int('')")],
)


#: The Ray target: the actor on two Ray actors of a session-wide head. Each run starts its actors afresh (a
#: new driver's worker group), which costs seconds, so the default matrix is one small case per mode: the
#: async one carries rollouts over across checkpoints (latency "mixed"), the sync one crosses an epoch.
RAY_WORKERS = 2
RAY_CASES = (
    {"id": "ray2-async-n8-b4-r6-e1-mixed", "mode": "async", "n": 8, "refill": 6, "epochs": 1, "latency": "mixed"},
    {"id": "ray2-sync-b4-e2", "mode": "sync", "n": 8},
)


def _ray_head_service() -> Any:
    from agentlightning.verl.ray_cluster import ray_head_service

    return ray_head_service()


#: The Agent Lightning VERL trainer with its actor on verl's RayWorkerGroup (2 CPU Ray actors). No crash smoke
#: cells: its crash cells are agentlightning_ray_crash's, on request, as each of its runs costs seconds.
agentlightning_ray = resume_target(
    fit_ray, name="agentlightning_ray", steps=ray_steps, boundaries=ray_boundaries, cases=RAY_CASES,
    contract=BOTH_LEDGERS, preload=PRELOAD, services=[_ray_head_service], hang_timeout=300, crash_save=False,
)


#: The Ray target's crash-consistency cells, on request (35 crash cells beside 7 kill-point cells, two runs
#: each): faults at each file operation of the save of step 2 that the recorder sees, which are the driver's
#: 9 (data.pt, its folder, the tracker). The actors' model saves run in Ray's worker
#: processes, out of the recorder's reach; they are complete before the driver's own files are written.
agentlightning_ray_crash = agentlightning_ray.with_options(
    name="agentlightning_ray_crash", cases=(RAY_CASES[1],), resume_modes=(RESUME_AUTO,), crash_save=(2, 1),
)


def _has_verl() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "torchdata", "verl"))


#: Registered through the entry point; empty where verl is not installed.
TARGETS = ([agentlightning_async, agentlightning_sync, verl_stock_sync, agentlightning_ray, agentlightning_ray_crash]
           if _has_verl() else [])
#: This repository's default matrix (tests/conftest.py): all but the Ray targets, whose runs take seconds
#: each; they run when named (``--resume-matrix-target=agentlightning_ray``), and part of them in their tests.
DEFAULT_TARGETS = [target for target in TARGETS if target not in (agentlightning_ray, agentlightning_ray_crash)]
