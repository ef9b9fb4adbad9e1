"""The run context a target sees inside its child process.

A target is a function ``fn(run: RunContext) -> None`` that builds its trainer and drives its own
training loop. Through ``run`` it learns where to checkpoint and whether to resume, and it reports
what it consumes. The harness steers it only through :meth:`RunContext.should_checkpoint` and the
report calls: when the plan says "kill here", the report call announces it and blocks until the
supervisor's SIGKILL arrives.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pytest_resume_check.client import plain_ids
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.ledger import step_inputs_digest
from pytest_resume_check.records.plan import (  # noqa: F401  (re-exported: targets import them from here)
    LAUNCHER_TORCHRUN,
    RESUME_AUTO,
    RESUME_DISABLED,
    RESUME_MODES,
    RESUME_PATH,
    SIGNAL_TERM,
    KillSpec,
    RunPlan,
)
from pytest_resume_check.records.state import (
    CAPTURED,
    DIGEST_COMPONENT,
    Undigestable,
    captured_generators,
    combine,
    first_not_close,
    leaf_digests,
    load_values,
    plain_values,
    save_values,
)

__all__ = ["KillSpec", "RESUME_AUTO", "RESUME_DISABLED", "RESUME_MODES", "RESUME_PATH", "RunContext", "RunPlan"]


class Converged(BaseException):
    """Raised inside the target when its state equals the reference's: the child stops cleanly.
    A BaseException, so a trainer's ``except Exception`` does not swallow it."""


class StepLimit(BaseException):
    """Raised inside the target when it goes on far past the case's last step (three times its steps):
    the run is stopped and judged ``PROTOCOL``. A BaseException, so a trainer's ``except Exception``
    does not swallow it."""


class EventSink(Protocol):
    """Where the context writes events (the child's end of the event channel)."""

    def send(self, event: ev.Event) -> None: ...


class ControlChannel(Protocol):
    """The child's end of the supervisor's control channel: a blocking read that returns when the
    supervisor lets a paused run go on (after a preemption's SIGTERM, or a copy of what is on disk)."""

    def recv_bytes(self) -> bytes: ...


class SaveWatcher(Protocol):
    """What the context tells the file-operation recorder of a crash cell (``child.recorder.Recorder``):
    the save of ``step`` starts, and it was published."""

    def start(self, step: int) -> None: ...

    def finish(self, step: int) -> None: ...


#: In a cell's folder: what resumed run ``i`` restored, kept as the report's evidence (``restored-run1``).
RESTORED = "restored-"

#: The values :meth:`RunContext.settings` takes: plain ones, which travel as they are and read the same back.
SETTING_TYPES = (str, int, float, bool, type(None))
ERR_SETTING = ("run.settings({{{name!r}: ...}}): got a {type}; a setting is a plain value (a str, int, float, bool "
               "or None), e.g. run.settings({{\"dataloader_num_workers\": 0}})")


def keep_restored(source: Path, log_path: Path) -> None:
    """Keep what a resumed run restored beside its log (``restored-run1/`` for ``run1.log``), as hard links:
    a trainer that keeps only its last N checkpoints may delete it later in the run, and a failing cell's
    report must still show it. Costs no copy of the data; anything that cannot be linked is skipped. Only
    what lies inside the cell's own folder is kept (``run.resumed(3, "/usr")`` linked a whole
    tree for 73 s)."""
    dest = log_path.parent / (RESTORED + log_path.stem)
    try:
        if log_path.parent.resolve() not in source.resolve().parents:  # not the run's: no evidence of ours
            return
        if source.is_dir():
            shutil.copytree(source, dest, symlinks=True, copy_function=_link, dirs_exist_ok=True)
        elif source.is_file():
            dest.mkdir(exist_ok=True)
            _link(str(source), str(dest / source.name))
    except OSError:  # evidence only: never the run's problem
        pass


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: no evidence rather than a copy
        pass


class RunContext:
    """What a target sees: paths, resume mode, case, seed, and the report calls.

    Report calls are cheap and must be made in this order within a step: ``consumed`` (any number of
    times), ``trained`` (optional), ``step_end``; then, if ``should_checkpoint(step)`` or the trainer's
    own schedule says so, save and call ``checkpoint_published``. A resumed run calls ``resumed`` once
    before it consumes anything.
    """

    def __init__(self, plan: RunPlan, sink: EventSink, control: ControlChannel | None = None,
                 recorder: SaveWatcher | None = None, rank: int = 0):
        self.plan = plan
        self._rank = rank
        #: Only one rank's report calls carry the kill point (see RunPlan.watched_rank).
        self._watching = rank == plan.watched_rank
        self._sink = sink
        self._control = control
        self._recorder = recorder
        self._resumed_step: int | None = None
        self._state_step: int | None = None
        self._ended = 0  # the last step whose step_end was reported
        self._state_seen: dict[str, str] = {}
        self._before_captured: int | None = None  # the last step whose first inputs the generators were captured at
        #: The inputs this run consumed by step, while it may stop early (the early stop compares them).
        self._inputs: dict[int, list[tuple[int | str, int]]] = {}
        #: (step, thread) of a state equal to the reference's: the run stops as that thread takes the next
        #: step's first inputs, if they are the reference's (see _check_converged).
        self._converging: tuple[int, int] | None = None
        #: Whether this run reported a leaf the harness cannot digest (its PROTOCOL line is sent once).
        self._undigestable = False

    # -- what the target reads -------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        """The output directory this run writes its checkpoints to (exists)."""
        return Path(self.plan.checkpoint_dir)

    @property
    def resume_mode(self) -> str:
        """``auto`` (latest checkpoint in :attr:`checkpoint_dir`), ``path`` or ``disabled``."""
        return self.plan.resume_mode

    @property
    def resume_path(self) -> Path | None:
        """In ``path`` mode, the checkpoint folder to resume from (may be in another directory)."""
        return Path(self.plan.resume_path) if self.plan.resume_path else None

    @property
    def case(self) -> Mapping[str, Any]:
        """The case parameters of this matrix cell (shuffle, batch sizes, epochs, ...)."""
        return self.plan.case

    @property
    def seed(self) -> int:
        """The seed for everything random in this run (same for reference and interrupted runs)."""
        return self.plan.seed

    @property
    def is_resume(self) -> bool:
        """True for a run that follows a killed one."""
        return self.plan.is_resume

    @property
    def rank(self) -> int:
        """This process's rank (0 in a one-process run); also in the environment as ``RANK``."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many ranks this run has (``WORLD_SIZE``); after an elastic resume, another number than
        the killed run's."""
        return self.plan.world_size

    # -- what the target reports -----------------------------------------------------------------
    def resumed(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """Report the checkpoint actually restored: its step (0 when starting fresh) and folder."""
        if self._resumed_step is not None:
            self._violation(f"called run.resumed({int(step)}) a second time (it first said step {self._resumed_step})")
        self._resumed_step = int(step)
        if path and (self.plan.is_resume or self.plan.restart):
            keep_restored(Path(path), Path(self.plan.log_path))
        self._sink.send(ev.Event(ev.RESUMED, step=int(step), path=str(path) if path else None))

    def consumed(self, ids: Iterable[Any], *, step: int, epoch: int) -> None:
        """Report inputs taken from the data pipeline for training in ``step``, in order."""
        self._check_open("consumed", step)
        taken = tuple(plain_ids(ids))
        self._stop_if_converged(int(step), taken, int(epoch))
        if self.plan.report_state and self.plan.capture_rng and self._before_captured != int(step) and step > 1:
            # The step's first inputs: what the process-global generators are as training goes on, so a
            # resume is judged by the generators it continues with (restored before or after the loader's
            # iterator started), not by those at the moment it reported its restored state. (Not before
            # step 1: a fresh start restores nothing.)
            self._before_captured = int(step)
            self._sink.send(ev.Event(ev.STATE, step=int(step) - 1, extra={**self._digested(captured_generators()),
                                                                          ev.STATE_BEFORE_NEXT: True}))
        if self.plan.converge:
            self._inputs.setdefault(int(step), []).extend((i, int(epoch)) for i in taken)
        self._sink.send(ev.Event(ev.CONSUMED, step=int(step), epoch=int(epoch), ids=taken))

    def trained(self, ids: Iterable[Any], *, step: int, epoch: int) -> None:
        """Report inputs used in the update of ``step`` (for trainers with a separate training stage)."""
        self._check_open("trained", step)
        self._sink.send(ev.Event(ev.TRAINED, step=int(step), epoch=int(epoch), ids=tuple(plain_ids(ids))))

    def step_end(self, step: int) -> None:
        """Report that ``step``'s update is done. The harness may kill the run here."""
        limit = self.plan.step_limit
        if limit is not None and int(step) > limit:
            self._violation(f"went on past step {limit}, three times the case's steps: stopped at the end of step "
                            f"{int(step)} (a trainer that never stops)")
            raise StepLimit(int(step))
        self._ended = max(self._ended, int(step))
        if self.plan.report_state and self.plan.capture_rng:
            # Before the step's end: an all-ranks kill waits for every rank's step_end, so what comes
            # before it is on the channel when SIGKILL lands, whatever the timing (records.results).
            self._capture(int(step))
        self._sink.send(ev.Event(ev.STEP_END, step=int(step)))
        kill = self.plan.kill
        if kill is not None and self._watching and kill.extra_steps > 0 and kill.kill_step == step:
            self._await_kill(kill.describe())

    def should_checkpoint(self, step: int) -> bool:
        """True when the harness wants a checkpoint at the end of ``step``."""
        wanted = int(step) in self.plan.checkpoint_steps
        if wanted and self._recorder is not None:
            self._recorder.start(int(step))  # the save that follows is watched
        return wanted

    def checkpoint_published(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """Report that the checkpoint of ``step`` is complete and selected for resume."""
        if self._recorder is not None:
            self._recorder.finish(int(step))
        self._sink.send(ev.Event(ev.CHECKPOINT, step=int(step), path=str(path) if path else None))
        if int(step) in self.plan.pause_steps and self._control is not None:
            if self.plan.restart:  # only a torchrun restart that waits for a lost node to rejoin pauses
                self._await_rejoin_stop(self._control, int(step))
            self._sink.send(ev.Event(ev.PAUSED, step=int(step)))
            self._control.recv_bytes()  # the supervisor copied what is on disk; go on
        kill = self.plan.kill
        if kill is not None and self._watching and kill.extra_steps == 0 and kill.checkpoint_step == step:
            self._await_kill(kill.describe())

    def state(self, step: int, components: Mapping[str, Any]) -> None:
        """Optional: report the trainer's state after ``step`` by component, e.g. ``{"model": model,
        "optimizer": optimizer, "scheduler": scheduler, "rng": torch.get_rng_state()}`` (tensors,
        state dicts, objects with ``state_dict()``, numbers, nested dicts and lists; :func:`state_of`
        finds them on a trainer object).

        Each step's state is compared with the uninterrupted run's at the same step, on every rank
        against the same rank: the first difference fails the cell as ``STATE_DIVERGED``, naming the
        components and the first differing key. Call it after ``step_end`` and after any checkpoint of
        that step, and once more right after restoring: ``run.state(k, ...)`` after ``run.resumed(k)``
        is compared with the reference's state at step k (what the checkpoint restored). Several calls in
        one step add components. Digests are computed here, in the child, and only in runs whose state is
        compared: a first run that will be killed pays nothing. A resumed run whose state equals the
        reference's may stop there (the target's ``early_stop``; the reference supplies the rest).
        """
        if not self.plan.report_state:
            return
        step = int(step)
        if self.plan.state_tolerance is not None:
            self._state_values(ev.STATE, step, components)
            return
        digests = self._send_digests(ev.STATE, step, components)
        if digests is not None:
            self._check_converged(step, digests)

    def final(self, components: Mapping[str, Any]) -> None:
        """Optional: report what the job delivers, once, at the end of training: the exported model, its
        EMA weights, the metrics (components as for :meth:`state`). The interrupted job's final outputs
        must equal the uninterrupted run's (exactly, or under the target's ``state_tolerance``); a target
        that reports them is never stopped early, so its last run always gets here."""
        if not self.plan.report_state:
            return
        if self.plan.state_tolerance is not None:
            self._state_values(ev.FINAL, None, components)
            return
        self._send_digests(ev.FINAL, None, components)

    def state_digest(self, step: int, digest: str) -> None:
        """Optional: report one digest of the trainer's *whole* state after ``step`` (see
        :mod:`pytest_resume_check.digest`); it counts as one state component, ``state_digest``.
        Prefer :meth:`state`, which names the component that differs."""
        self.state(step, {DIGEST_COMPONENT: str(digest)})

    def settings(self, values: Mapping[str, Any]) -> None:
        """Optional: how the framework in this run is set up, as plain values (``{"dataloader_num_workers": 0}``).
        Nothing compares them: a failing cell's report reads them to tell whether a framework's known bug
        (docs/findings.md) can be what the cell shows, since each such bug needs a setup of its own. The
        integrations report what their frameworks' findings need; later calls add names or replace them."""
        for name, value in values.items():
            if not isinstance(value, SETTING_TYPES):
                raise TypeError(ERR_SETTING.format(name=name, type=type(value).__name__))
        self._sink.send(ev.Event(ev.SETTINGS, extra={str(name): value for name, value in values.items()}))

    def log(self, text: str) -> None:
        """Write a line to this run's log file (``run<i>.log``, beside the child's stdout and stderr), which a
        failing cell's report quotes; it also travels to the parent as an event."""
        lines = "".join(f"{ev.LOG_PREFIX}{line}\n" for line in str(text).rstrip("\n").split("\n"))
        try:  # one write in append mode: whole lines, also from several threads
            fd = os.open(self.plan.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:  # a full disk or a vanished folder: the event below still carries it
            pass
        self._sink.send(ev.Event(ev.LOG, text=str(text)))

    def _check_open(self, call: str, step: int) -> None:
        """Inputs belong to a step before its ``step_end``; later ones are a reporting mistake."""
        if int(step) <= self._ended:
            self._violation(f"called run.{call}(step={int(step)}) after run.step_end({self._ended}); report a step's "
                            "inputs before its step_end")

    def _violation(self, text: str) -> None:
        self._sink.send(ev.Event(ev.VIOLATION, text=text))

    def _send(self, event: ev.Event) -> None:
        """Pass an event through as it is (a command target relays its program's file operations)."""
        self._sink.send(event)

    def _send_digests(self, kind: str, step: int | None, components: Mapping[str, Any]) -> dict[str, str] | None:
        """Digest ``components`` and send them as one ``kind`` event; returns the component digests, or None when
        a leaf cannot be digested the same way in every run (then the run's ``PROTOCOL`` line is sent instead)."""
        try:
            extra = self._digested(components)
        except Undigestable as exc:
            self._refused(kind, step, exc)
            return None
        self._sink.send(ev.Event(kind, step=step, extra=extra))
        return extra[ev.STATE_DIGESTS]

    @staticmethod
    def _digested(components: Mapping[str, Any]) -> dict[str, Any]:
        """A state event's ``extra`` for ``components``: their digests and their leaves' digests."""
        leaves = {}
        for name, value in components.items():
            try:
                leaves[str(name)] = leaf_digests(value)
            except Undigestable as exc:
                raise exc.below(name) from None
        return {ev.STATE_DIGESTS: {name: combine(values) for name, values in leaves.items()}, ev.STATE_LEAVES: leaves}

    def _refused(self, kind: str, step: int | None, exc: Undigestable) -> None:
        """A reported leaf the harness cannot digest the same way in every run: the run's ``PROTOCOL`` line naming
        it, its type and the fix, instead of a digest that would differ between runs holding the same state (a
        false ``NONDETERMINISTIC``) or an error blamed on the trainer. Sent once a run: the first says it all."""
        if self._undigestable:
            return
        self._undigestable = True
        root, call = ("final", "run.final()") if kind == ev.FINAL else ("state", f"run.state(step={step})")
        self._violation(exc.message(root, call))

    def _capture(self, step: int) -> None:
        """Record the process-global generators after ``step`` as components of their own (the trainer
        need not think of them). Under a tolerance they are compared exactly all the same."""
        digests = self._send_digests(ev.STATE, step, captured_generators())
        if digests is not None:
            self._seen(step, digests)

    def _seen(self, step: int, digests: Mapping[str, str]) -> None:
        if self._state_step != step:
            self._state_step, self._state_seen = step, {}
        self._state_seen.update(digests)

    def _check_converged(self, step: int, digests: Mapping[str, str]) -> None:
        """Stop the run once every component reported in this step equals the reference's, and so does
        every captured generator the reference still draws from (the ones ``converge`` lists), it took the
        reference's inputs at each of its steps, and it takes the reference's inputs of the next step next:
        its position in the epoch matches too (a replay still pending would make its epoch longer, and the
        reference's rest would hide it). The stop then comes in that next :meth:`consumed` call, before it
        reports anything; where the reference took no inputs after this step, at once."""
        self._seen(step, digests)
        self._converging = None
        resumed = self._resumed_step
        want = self.plan.converge.get(step)
        if not want or resumed is None or step <= resumed:
            return
        inputs = self.plan.converge_inputs
        if any(inputs.get(s) != step_inputs_digest(self._inputs.get(s, ())) for s in range(resumed + 1, step + 1)):
            return
        seen = self._state_seen
        reported = {name for name in seen if name not in CAPTURED}
        if reported == {name for name in want if name not in CAPTURED} and all(
                seen.get(name) == digest for name, digest in want.items()):
            if step + 1 in inputs:
                self._converging = (step, threading.get_ident())
                return
            self._sink.send(ev.Event(ev.CONVERGED, step=step))
            raise Converged(step)

    def _stop_if_converged(self, step: int, ids: tuple[Any, ...], epoch: int) -> None:
        """The stop :meth:`_check_converged` left for the next step's first inputs: taken here when they are
        the reference's, by the thread whose state report matched (a Converged raised in another thread would
        end only that thread), before this call reports anything."""
        converging, self._converging = self._converging, None
        if converging is None:
            return
        at, thread = converging
        if step == at + 1 and thread == threading.get_ident() and self.plan.converge_inputs.get(step) == \
                step_inputs_digest((i, epoch) for i in ids):
            self._sink.send(ev.Event(ev.CONVERGED, step=at))
            raise Converged(at)

    def _state_values(self, kind: str, step: int | None, components: Mapping[str, Any]) -> None:
        """Tolerance mode: write the values (first reference run) or compare them with the reference's
        here, in the child, and report which components are not close (no early stop). ``step`` None:
        the final outputs."""
        values = {}
        for component, value in components.items():
            try:
                values[str(component)] = plain_values(value)
            except Undigestable as exc:
                self._refused(kind, step, exc.below(component))
                return
        name = (f"step_{step}" if step is not None else "final") + (f"_rank{self._rank}" if self._rank else "") + ".pkl"
        if self.plan.state_values_dir:
            path = Path(self.plan.state_values_dir) / name
            saved = load_values(path) or {}
            save_values(path, {**saved, **values})
        compared: dict[str, str | None] = {}
        resumed = self._resumed_step
        comparable = step is None or not self.plan.is_resume or (resumed is not None and step >= resumed)
        if self.plan.state_reference_dir and comparable:
            reference = load_values(Path(self.plan.state_reference_dir) / name)
            if reference is not None:
                rtol, atol = self.plan.state_tolerance or (0.0, 0.0)
                compared = {component: first_not_close(ours, reference.get(component, {}), rtol, atol)
                            for component, ours in values.items()}
        self._sink.send(ev.Event(kind, step=step, extra={ev.STATE_COMPARED: compared}))

    def _say_ready(self, why: str, extra: dict[str, Any] | None = None) -> None:
        """A thread of a crash cell's save that got to where it stops without stopping (at its end, where another
        thread may wait for it): the kill waits for its word too, and it runs on."""
        self._sink.send(ev.Event(ev.KILL_READY, text=why, extra={**(extra or {}), "pid": os.getpid()}))

    def _await_kill(self, why: str, extra: dict[str, Any] | None = None) -> None:
        extra = {**(extra or {}), "pid": os.getpid()}
        kill = self.plan.kill
        if kill is not None and kill.signal == SIGNAL_TERM and self._control is not None and kill.fault is None:
            # Preemption: the supervisor sends SIGTERM to every rank, then lets this call return, so the
            # trainer's handler can save within the grace period; SIGKILL follows when it ends.
            if self.plan.launcher == LAUNCHER_TORCHRUN and threading.current_thread() is threading.main_thread():
                ready = ev.Event(ev.KILL_READY, text=why, extra={**extra, "signal": SIGNAL_TERM})
                self._await_forwarded_term(self._control, ready)
                return
            self._sink.send(ev.Event(ev.KILL_READY, text=why, extra={**extra, "signal": SIGNAL_TERM}))
            self._control.recv_bytes()
            return
        self._sink.send(ev.Event(ev.KILL_READY, text=why, extra=extra))
        while True:  # the supervisor's SIGKILL ends this process
            time.sleep(60)

    def _await_rejoin_stop(self, control: ControlChannel, step: int) -> None:
        """Rank 0 of a torchrun job that went on without a lost node, at the checkpoint where the cell brings
        the node back: the supervisor wakes the node's agent, and torchrun's agents stop their workers for
        the new member with SIGTERM, which ends this worker here, right after the checkpoint, whatever the
        trainer does on SIGTERM (what the ``:term`` cells check) and whatever the timing. Never returns."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Elsewhere than in the main thread the trainer's handler stays: a handler that does not end the worker
        # leaves it to torchrun's SIGKILL, 30 s later.
        self._sink.send(ev.Event(ev.PAUSED, step=step))
        while True:
            control.recv_bytes()  # never answered

    def _await_forwarded_term(self, control: ControlChannel, ready: ev.Event) -> None:
        """Preemption under torchrun: the supervisor signals the agent, which forwards SIGTERM to its workers
        in its own time, so this call returns only once the signal has reached this worker (or the grace
        period is over); then the trainer's own handling of it happens, as it would have had the signal come
        while the call blocked. Without this wait the trainer went on before the signal came and, at its last
        step, finished without saving: a verdict decided by timing."""
        arrived = threading.Event()
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda signum, frame: arrived.set())
        try:
            self._sink.send(ready)
            control.recv_bytes()
            grace = self.plan.kill.grace if self.plan.kill is not None else 0.0
            arrived.wait(grace)  # a signal's handler runs during this wait (main thread)
        finally:
            signal.signal(signal.SIGTERM, previous)
        if not arrived.is_set():
            return
        if callable(previous):
            previous(signal.SIGTERM, None)
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)  # what the signal would have done: end this worker
