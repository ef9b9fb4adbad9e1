"""The pytest side of ``--resume-matrix-ray``: the session's cells run on a Ray cluster, one task per group
of cells that share a first run and a reference (target, case, resume mode), and each pytest item waits
for its own cell's outcome.

:meth:`RayExecutor.connect` connects (:mod:`.connection`: a cluster that cannot be reached is one
:class:`ClusterError` naming the fix); :meth:`RayExecutor.start` answers at once the cells of a target no
node can run (its ``resources=``), and submits the other groups, each asking Ray for exactly its target's
resources per task. A thread per task reads its records as they come (:mod:`.node`) and makes each the
outcome its item reports (:mod:`.outcomes`: evidence unpacked here, paths pointing here, what was not
copied back named). A task whose node is lost fails its unfinished cells with one line naming the node,
or, with retries left, runs them again elsewhere. :meth:`RayExecutor.close` stops every task still
running (through the session's control actor: Ray's cancel does not reach a running generator task) and
waits for each to end what it started.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_resume_check.cluster import wire
from pytest_resume_check.cluster.connection import (
    LOST_NODE,
    ClusterError,
    amounts,
    connect,
    first_line,
    fits,
    header,
    is_node_lost,
    plain,
)
from pytest_resume_check.cluster.evidence import Refused
from pytest_resume_check.cluster.outcomes import (
    CellOutcome,
    Receiving,
    node_name,
    outcome_of,
    placement,
    refused_line,
)

#: How long the end of the session waits for stopped tasks to end their groups' pytest sessions.
CANCEL_WAIT = 120.0
#: How long the session's control actor may take to start, or to take the stop.
ACTOR_TIMEOUT = 120.0
#: The resource only Ray's head node has (the session's control actor lives there).
HEAD_RESOURCE = "node:__internal_head__"

ERR_ACTOR = ("{opt}: the session's control actor did not start on the Ray head within {seconds:g} s ({error}); check "
             "the head's health (ray status)")

#: The headline of the cells of a target no node has the resources for.
MSG_NO_NODE = ("target {target!r} needs {need} a run (resources=), and no node of the Ray cluster at {address} has "
               "that (its nodes: {nodes}); add a node that has it, or declare the resources= a node has")
#: The headline of a cell whose task's node was lost before the cell had its outcome.
MSG_NODE_LOST = ("Ray node {node} was lost while it ran this cell's group ({error}); nothing was judged: rerun the "
                 "cell, or give {opt}=1 to run a lost node's unfinished cells again elsewhere")
MSG_WORKER_LOST = ("the Ray worker that ran this cell's group on node {node} died ({error}: out of memory, or "
                   "killed); nothing was judged: rerun the cell, or give {opt}=1 to run its group's unfinished cells "
                   "again")
#: The headline of a cell its task ended without (the group's pytest stopped early, or the task failed).
MSG_NOT_RUN = "the group's pytest on node {node} ended {how} before this cell had an outcome: {why}"
#: The outcome of a cell asked for after the session stopped the cluster's tasks.
MSG_STOPPED = "HARNESS: the session stopped its Ray tasks before this cell had an outcome; rerun the cell"
MSG_CANCEL_PROBLEM = "the Ray task of {group} did not end within {seconds:g} s of the session's stop (node {node})"


@dataclass
class Task:
    """One submitted group: its cells (names in item order), the Ray generator, the node it runs on."""

    group: str
    cells: list[str]
    spec: dict[str, Any]
    options: dict[str, Any]
    generator: Any = None
    node: dict[str, str] = field(default_factory=dict)
    tries: int = 0
    thread: threading.Thread | None = None

    def node_name(self) -> str:
        """The task's node as a report names it."""
        return node_name(self.node)


@dataclass
class Settings:
    """What the executor needs of the session's settings."""

    address: str
    retries: int
    copy_bytes: int
    option: str
    retries_option: str
    copy_option: str


class RayExecutor:
    """Runs a session's cells on a Ray cluster; see the module."""

    def __init__(self, settings: Settings, root: Path):
        self.settings = settings
        self.root = root
        self.session = uuid.uuid4().hex
        self._outcomes: dict[str, CellOutcome] = {}
        self._cond = threading.Condition()
        self._tasks: list[Task] = []
        self._ray: Any = None
        self._control: Any = None
        self._closing = False
        #: The nodes alive when the session connected.
        self.nodes: list[dict[str, Any]] = []
        #: Keys the digests of the variables the runs read on a node (values never leave a machine).
        self.env_key = secrets.token_hex(16)
        self._receiving = Receiving(root, settings.copy_bytes, settings.copy_option, self.env_key)

    # -- start ---------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to the cluster as a driver; :class:`ClusterError` naming the fix if it cannot be."""
        self._ray, self.nodes = connect(self.settings.option, self.settings.address)

    def header(self) -> str:
        """The session header's line: the cluster's address and its nodes with their resources."""
        return header(self.settings.address, self.nodes)

    def placement(self) -> str | None:
        """The summary's line: how many cells ran on each node (None before any cell had an outcome)."""
        with self._cond:
            outcomes = list(self._outcomes.values())
        return placement(outcomes, self.settings.address)

    def start(self, groups: Sequence[tuple[str, list[str], Mapping[str, float], list[str], Mapping[str, str | None]]],
              cwd: str) -> None:
        """Submit ``groups``: (label, cell names, resources of one run, the group pytest's arguments, the
        variables its runs get from here: None unsets one). A group whose resources no node has is answered
        here, each of its cells with one line."""
        from pytest_resume_check import categories
        from pytest_resume_check.cluster.node import Control, run_group

        ray = self._ray
        remote = ray.remote(run_group)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        # On the head: an actor on a node that is lost would tell every task the session stopped.
        head = {HEAD_RESOURCE: 0.001} if any(HEAD_RESOURCE in n.get("Resources", {}) for n in nodes) else {}
        self._control = ray.remote(num_cpus=0)(Control).options(name=f"resume-check-{self.session}",
                                                                resources=head).remote()
        try:  # ready before any task asks it
            ray.get(self._control.stopped.remote(), timeout=ACTOR_TIMEOUT)
        except Exception as exc:
            raise ClusterError(ERR_ACTOR.format(opt=self.settings.option, seconds=ACTOR_TIMEOUT,
                                                error=first_line(exc))) from None
        for label, names, need, args, env in groups:
            if not any(fits(need, n.get("Resources", {})) for n in nodes):
                text = f"{categories.TARGET_ERROR}: " + MSG_NO_NODE.format(
                    target=label.split(" ")[0], need=amounts(need), address=self.settings.address,
                    nodes="; ".join(f"{n.get('NodeManagerAddress')} {amounts(plain(n.get('Resources', {})))}"
                                    for n in nodes) or "none alive")
                for name in names:
                    self._answer(name, CellOutcome(wire.FAILED, text, category=categories.TARGET_ERROR))
                continue
            need = dict(need)
            options = {"num_cpus": need.pop("CPU", 0.0), "num_gpus": need.pop("GPU", 0.0), "resources": need,
                       "max_retries": 0, "retry_exceptions": False, "name": f"resume-check {label}"}
            spec = {"session": self.session, "cwd": cwd, "args": args, "copy_limit": self.settings.copy_bytes,
                    "env": dict(env), "env_key": self.env_key}
            task = Task(label, list(names), spec, options)
            self._tasks.append(task)
            self._submit(task, remote)

    def _submit(self, task: Task, remote: Any) -> None:
        task.generator = remote.options(**task.options).remote(task.spec, self._control)
        task.thread = threading.Thread(target=self._follow, args=(task, remote), daemon=True,
                                       name=f"resume-check-ray {task.group}")
        task.thread.start()

    # -- results -------------------------------------------------------------------------------------

    def outcome(self, name: str) -> CellOutcome:
        """The outcome of cell ``name``, once its task reported it (Ctrl-C interrupts the wait)."""
        with self._cond:
            while name not in self._outcomes and not self._closing:
                self._cond.wait(0.5)
            return self._outcomes.get(name) or CellOutcome(wire.FAILED, MSG_STOPPED, category="HARNESS")

    def _answer(self, name: str, outcome: CellOutcome) -> None:
        with self._cond:
            self._outcomes.setdefault(name, outcome)
            self._cond.notify_all()

    def _follow(self, task: Task, remote: Any) -> None:
        """Read one task's records until it ends; then its unanswered cells get one line each."""
        from pytest_resume_check import categories

        ray = self._ray
        why: tuple[str, str] | None = None
        try:
            for ref in task.generator:
                record = ray.get(ref)
                if "node" in record:
                    task.node = record["node"]
                elif "ended" in record:
                    code, tail = record["ended"], record.get("tail") or []
                    why = (f"with exit code {code}" if code is not None else "at once",
                           _last_error(tail))
                else:
                    self._answer(record["name"], self._outcome_of(record, task))
        except Exception as exc:
            if self._closing:
                return
            lost = is_node_lost(ray, exc)
            left = [n for n in task.cells if n not in self._outcomes]
            if lost and left and task.tries < self.settings.retries and self._can_run(task):
                retry = Task(task.group, left, task.spec, task.options, tries=task.tries + 1)
                self._tasks.append(retry)
                self._submit(retry, remote)
                return
            if lost:
                template = MSG_NODE_LOST if lost == LOST_NODE else MSG_WORKER_LOST
                self._fail_left(task, categories.HARNESS, template.format(
                    node=task.node_name(), error=type(exc).__name__, opt=self.settings.retries_option))
                return
            why = ("with an error of its task", first_line(exc))
        if self._closing:
            return
        if why is not None or any(n not in self._outcomes for n in task.cells):
            how, detail = why or ("normally", "it reported no outcome for it")
            self._fail_left(task, categories.HARNESS, MSG_NOT_RUN.format(node=task.node_name(), how=how, why=detail))

    def _can_run(self, task: Task) -> bool:
        """Whether a node still alive has what one of ``task``'s runs needs (else a retry would wait forever)."""
        need = {"CPU": task.options["num_cpus"], "GPU": task.options["num_gpus"], **task.options["resources"]}
        lost = task.node.get("node_id")  # Ray may list it alive for a moment still
        return any(fits({k: v for k, v in need.items() if v}, n.get("Resources", {}))
                   for n in self._ray.nodes() if n.get("Alive") and n.get("NodeID") != lost)

    def _fail_left(self, task: Task, category: str, message: str) -> None:
        for name in task.cells:
            self._answer(name, CellOutcome(wire.FAILED, f"{category}: {message}", category=category))

    def _outcome_of(self, record: dict[str, Any], task: Task) -> CellOutcome:
        """A cell's record as its item reports it (:func:`.outcomes.outcome_of`)."""
        return outcome_of(record, task.node, task.spec.get("env", {}), self._receiving)

    def _refused_line(self, refused: Sequence[Refused], task: Task) -> str:
        return refused_line(refused, task.node, self.root)

    # -- the end -------------------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Cancel every task still running, wait for each to end its group (bounded), disconnect. Returns
        what went wrong, one line each."""
        if self._ray is None:
            return []
        self._closing = True
        ray = self._ray
        if self._control is not None and any(t.thread is not None and t.thread.is_alive() for t in self._tasks):
            try:
                ray.get(self._control.stop.remote(), timeout=ACTOR_TIMEOUT)
            except Exception:  # gone or not answering: the tasks end with the driver (their pipes close)
                pass
        problems = []
        deadline = time.monotonic() + CANCEL_WAIT
        for task in self._tasks:
            if task.thread is not None:
                task.thread.join(max(0.0, deadline - time.monotonic()))
                if task.thread.is_alive():
                    problems.append(MSG_CANCEL_PROBLEM.format(group=task.group, seconds=CANCEL_WAIT,
                                                              node=task.node_name()))
        try:
            ray.shutdown()
        finally:
            self._ray = None
        with self._cond:  # an item that would still wait gets MSG_STOPPED
            self._cond.notify_all()
        return problems


def _last_error(tail: Sequence[str]) -> str:
    """The line of a pytest's output that says what went wrong (its ``ERROR:``), else its last line."""
    errors = [ln for ln in tail if ln.startswith("ERROR")]
    return (errors[-1] if errors else tail[-1] if tail else "no output")[:400]
