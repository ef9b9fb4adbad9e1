"""The run context for a trainer that runs as its own command (``resume_target.command``): stdlib only.

A training script calls :func:`connect` once and reports through what it returns, as a Python target
reports through its ``RunContext``::

    from pytest_resume_check import client

    run = client.connect()          # outside the harness: a context whose calls do nothing
    ...
    run.resumed(step, checkpoint)   # once, before consuming anything (0 and None when fresh)
    for batch in batches:
        run.consumed(ids, step=step, epoch=epoch)
        ...
        run.step_end(step)          # the harness may kill the process here
        if run.should_checkpoint(step) or my_own_schedule(step):
            path = save(...)
            run.checkpoint_published(step, path)

Run without the harness, :func:`connect` returns an inactive context: ``should_checkpoint`` is False,
every report is a no-op and the script trains as it always does.

The harness starts the command with an inherited socket whose descriptor number is in the environment
variable ``RESUME_CHECK_FD`` and the run's facts (checkpoint folder, resume mode and path, seed, case) as
JSON in ``RESUME_CHECK_CONTEXT``. Each report is one line of JSON (``{"call": "step_end", "step": 3}``)
answered by one line (``{"ok": true}``, with ``"value"`` for ``should_checkpoint``). Any language can speak
it; docs/recipes/command.md describes every call.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_resume_check.records.state import DIGEST_COMPONENT

__all__ = ["CONTEXT_ENV", "FD_ENV", "PROTOCOL_VERSION", "ProtocolError", "Run", "connect"]

#: The environment variable that holds the descriptor of the harness's socket.
FD_ENV = "RESUME_CHECK_FD"
#: The environment variable that holds the run's facts as JSON.
CONTEXT_ENV = "RESUME_CHECK_CONTEXT"
#: The line protocol's version, in the context (``"protocol": 1``).
PROTOCOL_VERSION = 1


def _state_fields(components: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a ``state`` or ``final`` line: the components themselves when they are JSON values, else
    each component's leaves digested here (``leaves``: a tensor cannot travel as JSON), or, for a leaf no digest
    can be the same in every run (a plain object), what the harness reports it as (``refused``: its keys, type
    and why), so the run is the ``PROTOCOL`` finding naming it rather than a program that crashed."""
    named = {str(k): v for k, v in components.items()}
    try:
        json.dumps(named, allow_nan=False)
    except (TypeError, ValueError):
        from pytest_resume_check.records.state import Undigestable, leaf_digests

        leaves = {}
        for name, value in named.items():
            try:
                leaves[name] = leaf_digests(value)
            except Undigestable as exc:
                keys = [name, *(k if isinstance(k, (str, int, float, bool)) else repr(k) for k in exc.keys)]
                return {"refused": {"keys": keys, "type": exc.type_name, "why": exc.why}}
        return {"leaves": leaves}
    return {"components": named}


class ProtocolError(RuntimeError):
    """The harness refused a call (its answer names why), or the socket broke."""


class Run:
    """What a command sees and reports through. Inactive (every call a no-op) outside the harness."""

    def __init__(self, context: Mapping[str, Any] | None = None, sock: socket.socket | None = None):
        context = dict(context or {})
        self.active = sock is not None
        #: The folder this run writes its checkpoints to (None outside the harness).
        self.checkpoint_dir: str | None = context.get("checkpoint_dir")
        #: ``auto`` (resume the latest checkpoint in checkpoint_dir), ``path`` or ``disabled`` (None outside).
        self.resume_mode: str | None = context.get("resume_mode")
        #: In ``path`` mode, the checkpoint to resume from.
        self.resume_path: str | None = context.get("resume_path")
        #: The seed for everything random in this run (None outside the harness).
        self.seed: int | None = context.get("seed")
        #: The matrix case's parameters.
        self.case: dict[str, Any] = dict(context.get("case") or {})
        #: True for a run that follows a killed one.
        self.is_resume: bool = bool(context.get("is_resume"))
        #: This process's rank and the run's number of ranks, from ``RANK`` and ``WORLD_SIZE`` (which the
        #: harness sets for each rank of a command target with ``world_size``); 0 and 1 without them.
        self.rank: int = _int_env("RANK", 0)
        self.world_size: int = _int_env("WORLD_SIZE", 1)
        self._sock = sock
        self._reader = sock.makefile("rb") if sock is not None else None
        self._lock = threading.Lock()
        self._recorder: Any = None
        if self.active and context.get("faults"):
            self._install_recorder(context["faults"])

    # -- reports ---------------------------------------------------------------------------------
    def resumed(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """The checkpoint actually restored: its step (0 when starting fresh) and path."""
        self._call("resumed", step=int(step), path=_path(path))

    def consumed(self, ids: Iterable[Any], *, step: int, epoch: int) -> None:
        """Inputs taken from the data for training in ``step``, in order."""
        if self.active:
            self._call("consumed", step=int(step), epoch=int(epoch), ids=plain_ids(ids))

    def trained(self, ids: Iterable[Any], *, step: int, epoch: int) -> None:
        """Inputs used in the update of ``step`` (trainers with a separate training stage)."""
        if self.active:
            self._call("trained", step=int(step), epoch=int(epoch), ids=plain_ids(ids))

    def step_end(self, step: int) -> None:
        """``step``'s update is done. The harness may kill the process here (the call does not return)."""
        self._call("step_end", step=int(step))

    def should_checkpoint(self, step: int) -> bool:
        """True when the harness wants a checkpoint at the end of ``step`` (always False outside it)."""
        wanted = bool(self._call("should_checkpoint", step=int(step)))
        if wanted and self._recorder is not None:
            self._recorder.start(int(step))  # the save that follows is watched
        return wanted

    def checkpoint_published(self, step: int, path: str | os.PathLike[str] | None = None) -> None:
        """The checkpoint of ``step`` is complete and selected for resume. The harness may kill here."""
        if self._recorder is not None:
            self._recorder.finish(int(step))
        self._call("checkpoint_published", step=int(step), path=_path(path))

    def state(self, step: int, components: Mapping[str, Any]) -> None:
        """Optional: the training state after ``step`` by component: JSON values (numbers, strings, lists,
        dicts), or anything the harness can digest (a torch ``state_dict()``, tensors, numpy arrays), which is
        then digested here, leaf by leaf, so a headline still names the first differing leaf
        (``optimizer differs (state.0.momentum_buffer)``). Compared with the uninterrupted run's at the same
        step; report it once more right after restoring (``state(k, ...)`` after ``resumed(k)``) to have what
        the checkpoint restored compared."""
        if self.active:
            self._call("state", step=int(step), **_state_fields(components))

    def final(self, components: Mapping[str, Any]) -> None:
        """Optional: what the program delivers, once, at the end of training (the exported model's digest or
        its state dict, its metrics), as for :meth:`state`; the interrupted job's must equal the uninterrupted
        run's."""
        if self.active:
            self._call("final", **_state_fields(components))

    def state_digest(self, step: int, digest: str) -> None:
        """Optional: one digest of the program's whole state after ``step``, the state component
        ``state_digest``; prefer :meth:`state`, which names the component that differs."""
        self.state(step, {DIGEST_COMPONENT: str(digest)})

    def log(self, text: str) -> None:
        """A line for this run's log, quoted by a failing cell's report."""
        self._call("log", text=str(text))

    # -- the wire --------------------------------------------------------------------------------
    def _call(self, call: str, **fields: Any) -> Any:
        if self._sock is None or self._reader is None:
            return None
        line = json.dumps({"call": call, **fields}, separators=(",", ":")) + "\n"
        with self._lock:  # one request and its answer at a time, from any thread
            try:
                self._sock.sendall(line.encode("utf-8"))
                answer = self._reader.readline()
            except OSError as exc:
                raise ProtocolError(f"resume-check: the harness's socket broke during {call}: {exc}") from exc
        if not answer:
            # The harness went away (it kills this process right after, or the run is over): stop here
            # rather than train on unreported.
            while True:
                time.sleep(60)
        reply = json.loads(answer)
        if not reply.get("ok"):
            raise ProtocolError(f"resume-check refused {call}: {reply.get('error')}")
        return reply.get("value")

    def _install_recorder(self, faults: Mapping[str, Any]) -> None:
        """Crash cells: watch this process's file operations during the save the harness names."""
        import importlib.util

        from pytest_resume_check.child.recorder import Recorder
        from pytest_resume_check.records.faults import FaultPlan

        if importlib.util.find_spec("torch") is not None:
            import torch  # noqa: F401  (so torch.save to a path is watched too)

        def on_op(op: Any) -> None:
            self._call("file_op", path=op.path, kind=op.kind, index=op.index, target=op.target, lane=op.lane)

        def on_kill(text: str, extra: Mapping[str, Any]) -> None:
            self._call("kill_ready", text=text, extra=dict(extra))
            while True:  # the harness kills this process now
                time.sleep(60)

        def on_ready(text: str, extra: Mapping[str, Any]) -> None:  # a thread at its end of the save runs on
            self._call("lane_ready", text=text, extra=dict(extra))

        rank = self.rank if self.world_size > 1 else None  # a rank of several stops where its plan says
        self._recorder = Recorder(FaultPlan.from_json(faults), self.checkpoint_dir or ".", on_op, on_kill, rank,
                                  on_ready)
        self._recorder.install()


#: The run context of a program the harness runs in a run's own process (set there by
#: :mod:`pytest_resume_check.child.command`): what :func:`connect` returns in that process.
_in_process: Run | None = None


def connect() -> Run:
    """The run context of this process: connected when the harness started it, inactive otherwise."""
    if _in_process is not None:
        return _in_process
    channel = harness_channel()
    if channel is None:
        return Run()
    return Run(*channel)


def harness_channel() -> tuple[dict[str, Any], socket.socket] | None:
    """The run's facts and the harness's socket when the harness started this process (None otherwise),
    taken once: the variable naming the socket leaves the environment, so a program this one starts does
    not find it."""
    fd = os.environ.get(FD_ENV)
    if not fd:
        return None
    try:
        context = json.loads(os.environ.get(CONTEXT_ENV) or "{}")
        sock = socket.socket(fileno=int(fd))
        os.set_inheritable(sock.fileno(), False)  # a program this one starts must not hold it open
    except (ValueError, OSError) as exc:
        raise ProtocolError(f"resume-check: {FD_ENV}={fd!r} is not the harness's socket ({exc}); unset it to run "
                            "the script without the harness") from exc
    os.environ.pop(FD_ENV, None)  # not for this process's own children
    return context, sock


def plain_ids(ids: Iterable[Any]) -> list[Any]:
    """Ids as JSON values: ints for integer-like values (tensors, numpy scalars), else strings."""
    out: list[Any] = []
    for i in ids:
        if hasattr(i, "item"):
            i = i.item()
        if isinstance(i, bool) or not isinstance(i, (int, str)):
            i = int(i) if isinstance(i, float) and i.is_integer() else str(i)
        out.append(i)
    return out


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _path(path: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(path) if path else None
