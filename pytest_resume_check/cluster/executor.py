"""The pytest side of ``--resume-matrix-ray``: the session's cells run on a Ray cluster, one task per group
of cells that share a first run and a reference (target, case, resume mode), and each pytest item waits
for its own cell's outcome.

:meth:`RayExecutor.start` connects (a cluster that cannot be reached is one :class:`ClusterError` naming
the fix), answers at once the cells of a target no node can run (its ``resources=``), and submits the
other groups, each asking Ray for exactly its target's resources per task. A thread per task reads its
records as they come (:mod:`.node`): a failing cell's kept folders are unpacked into this session's
folder (entry by entry, within the copy limit: :mod:`.evidence`), every path in its report and JSON points
there, and what was not copied back is named. A task whose node is lost fails its
unfinished cells with one line naming the node, or, with retries left, runs them again elsewhere.
:meth:`RayExecutor.close` stops every task still running (through the session's control actor: Ray's cancel
does not reach a running generator task) and waits for each to end what it started.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pytest_resume_check.cluster import wire
from pytest_resume_check.cluster.evidence import HERE, ON_NODE, THE_ARCHIVE, WHY_BROKEN, Refused, Unpacked, unpack
from pytest_resume_check.records.cell_json import CellJson
from pytest_resume_check.records.environ import differing

#: How long the end of the session waits for stopped tasks to end their groups' pytest sessions.
CANCEL_WAIT = 120.0
#: How long the session's control actor may take to start, or to take the stop.
ACTOR_TIMEOUT = 120.0
#: How long a head's address may take to accept a connection before it counts as unreachable.
CONNECT_TIMEOUT = 10.0
#: Ray's namespace for the session's tasks.
NAMESPACE = "pytest-resume-check"
#: The resource only Ray's head node has (the session's control actor lives there).
HEAD_RESOURCE = "node:__internal_head__"

ERR_NO_RAY = ("{opt} needs Ray in this environment and on every node: pip install 'ray[default]' (verl brings it); "
              "{error}")
ERR_UNREACHABLE = ("{opt}={address}: no Ray head answers there ({error}); start the cluster's head "
                   "(ray start --head --port=PORT) or give its address as host:port")
ERR_NO_CLUSTER = ("{opt}=auto: no Ray cluster found for this machine ({error}); start one (ray start --head), join "
                  "this machine to one, set RAY_ADDRESS, or give the head's address")
ERR_ACTOR = ("{opt}: the session's control actor did not start on the Ray head within {seconds:g} s ({error}); check "
             "the head's health (ray status)")
ERR_CONNECT = "{opt}={address}: connecting to the Ray cluster failed: {error}"
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
#: Added to a failing cell's report whose kept folders were too big to copy back.
MSG_LEFT_ON_NODE = ("  kept on node {node} (not copied back: {mb:.0f} MB, more than {opt}={limit:g}): {paths}")
#: The same, for kept folders the node could not pack (a fault of the harness there): they stay on the node.
MSG_NOT_PACKED = "  kept on node {node} (not copied back: packing them failed there: {why}): {paths}"
#: Added to a failing cell's report for the entries of its kept folders that were not copied back (one line:
#: the first :data:`NAMED` of them, then how many more the cell's JSON names under :data:`REFUSED_KEY`).
MSG_REFUSED = "  not copied back from node {node}: {entries}"
MSG_REFUSED_ENTRY = "{path} ({why}; {where})"
MSG_REFUSED_MORE = "; and {count} more (the cell's JSON names each, under {key})"
#: Where an entry was refused, as :data:`MSG_REFUSED_ENTRY` says it.
MSG_WHERE = {HERE: "refused here", ON_NODE: "left out on the node"}
NAMED = 3
#: In place of the ``kept:`` line of a cell none of whose kept folders could be unpacked here (the node
#: removed them with its group, so the line would name folders that no longer exist).
MSG_KEPT_NOTHING = ("  kept: nothing: the kept folders sent back by node {node} could not be unpacked here ({why}), "
                    "and the node removed them with its group")
#: Keys of a failing cell's JSON: the entries not copied back, the evidence sent back but not unpacked, the
#: evidence too big to copy that stayed on its node.
REFUSED_KEY: Final = "evidence_refused"
LOST_KEY: Final = "evidence_lost"
LEFT_KEY: Final = "kept_on_node"
#: The outcome of a cell asked for after the session stopped the cluster's tasks.
MSG_STOPPED = "HARNESS: the session stopped its Ray tasks before this cell had an outcome; rerun the cell"
MSG_CANCEL_PROBLEM = "the Ray task of {group} did not end within {seconds:g} s of the session's stop (node {node})"
#: The session header's line once connected: where the cells run.
MSG_HEADER = "resume-check: cells run on the Ray cluster at {address}: {count} node{s} alive: {nodes}"
#: The summary's line: how many cells ran where.
MSG_PLACES = "resume-check: {count} cell{s} ran on the Ray cluster at {address}: {places}"
MSG_PLACE = "{count} on node {node}"
#: Appended for the cells that had no outcome from any node (refused, lost, stopped): their lines say why.
MSG_NOWHERE = "{count} without one (refused or lost: each says why)"
#: Appended for the cells whose runs read variables that differ between this machine and their node.
MSG_DIFFERING = "; {count} read environment variables that differ there (see the warnings)"


class ClusterError(Exception):
    """The cluster cannot be used; the message names the fix."""


@dataclass
class CellOutcome:
    """What a cell's item reports: ``kind`` as in :mod:`.wire`, the failure text or skip reason, the cell's
    JSON (paths pointing into this session's folder) and its reference runs' seconds."""

    kind: str
    text: str = ""
    cell_json: CellJson | None = None
    reference_seconds: float = 0.0
    #: A cell with no verdict: the category its JSON gets (``HARNESS``, ``TARGET_ERROR``).
    category: str | None = None
    #: The node the cell ran on (``node_id``, ``ip``, ``host``); empty: none (refused, lost, stopped).
    node: dict[str, str] = field(default_factory=dict)
    #: Variables its runs read that differ between this machine and the node (names, sorted).
    differs: list[str] = field(default_factory=list)


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
        return node_label(self.node) if self.node else "(not known yet)"


def node_label(node: Mapping[str, str]) -> str:
    """``10.0.0.6 (gpu-box-3, node id 430c63a39cbf)``: a node as the reports name it (two nodes may share a
    machine, never an id)."""
    return f"{node.get('ip', '?')} ({node.get('host', '?')}, node id {node.get('node_id', '?')[:12]})"


def _listed(node: Mapping[str, Any]) -> dict[str, str]:
    """A node of ``ray.nodes()`` as the tasks describe theirs (:func:`pytest_resume_check.cluster.node.node_info`)."""
    return {"node_id": str(node.get("NodeID", "?")), "ip": str(node.get("NodeManagerAddress", "?")),
            "host": str(node.get("NodeManagerHostname", "?"))}


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
        self._unpacking = threading.Lock()  # two groups of one case bring the same reference folder
        #: The nodes alive when the session connected.
        self.nodes: list[dict[str, Any]] = []
        #: Keys the digests of the variables the runs read on a node (values never leave a machine).
        self.env_key = secrets.token_hex(16)

    # -- start ---------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to the cluster as a driver; :class:`ClusterError` naming the fix if it cannot be."""
        s = self.settings
        try:
            import ray
        except ImportError as exc:
            raise ClusterError(ERR_NO_RAY.format(opt=s.option, error=exc)) from None
        address = _resolved(s.option, s.address)
        if not address.startswith("ray://") and address != "auto":
            _check_reachable(s.option, address, auto=s.address == "auto")
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
        except ConnectionError as exc:
            template = ERR_NO_CLUSTER if s.address == "auto" else ERR_UNREACHABLE
            raise ClusterError(template.format(opt=s.option, address=s.address, error=_first_line(exc))) from None
        except Exception as exc:
            raise ClusterError(ERR_CONNECT.format(opt=s.option, address=s.address, error=_first_line(exc))) from None
        self._ray = ray
        self.nodes = [n for n in ray.nodes() if n.get("Alive")]

    def header(self) -> str:
        """The session header's line: the cluster's address and its nodes with their resources."""
        nodes = "; ".join(f"{node_label(_listed(n))} with {_amounts(_plain(n.get('Resources', {})))}"
                          for n in self.nodes)
        return MSG_HEADER.format(address=self.settings.address, count=len(self.nodes),
                                 s="" if len(self.nodes) == 1 else "s", nodes=nodes or "none")

    def placement(self) -> str | None:
        """The summary's line: how many cells ran on each node (None before any cell had an outcome)."""
        with self._cond:
            outcomes = list(self._outcomes.values())
        if not outcomes:
            return None
        counts: dict[str, int] = {}
        for got in outcomes:
            if got.node:
                counts[node_label(got.node)] = counts.get(node_label(got.node), 0) + 1
        places = [MSG_PLACE.format(count=n, node=node) for node, n in sorted(counts.items(), key=lambda x: -x[1])]
        nowhere = len(outcomes) - sum(counts.values())
        if nowhere:
            places.append(MSG_NOWHERE.format(count=nowhere))
        line = MSG_PLACES.format(count=len(outcomes), s="" if len(outcomes) == 1 else "s",
                                 address=self.settings.address, places=", ".join(places))
        differ = sum(1 for got in outcomes if got.differs)
        return line + (MSG_DIFFERING.format(count=differ) if differ else "")

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
                                                error=_first_line(exc))) from None
        for label, names, need, args, env in groups:
            if not any(_fits(need, n.get("Resources", {})) for n in nodes):
                text = f"{categories.TARGET_ERROR}: " + MSG_NO_NODE.format(
                    target=label.split(" ")[0], need=_amounts(need), address=self.settings.address,
                    nodes="; ".join(f"{n.get('NodeManagerAddress')} {_amounts(_plain(n.get('Resources', {})))}"
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
            lost = _is_node_lost(ray, exc)
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
            why = ("with an error of its task", _first_line(exc))
        if self._closing:
            return
        if why is not None or any(n not in self._outcomes for n in task.cells):
            how, detail = why or ("normally", "it reported no outcome for it")
            self._fail_left(task, categories.HARNESS, MSG_NOT_RUN.format(node=task.node_name(), how=how, why=detail))

    def _can_run(self, task: Task) -> bool:
        """Whether a node still alive has what one of ``task``'s runs needs (else a retry would wait forever)."""
        need = {"CPU": task.options["num_cpus"], "GPU": task.options["num_gpus"], **task.options["resources"]}
        lost = task.node.get("node_id")  # Ray may list it alive for a moment still
        return any(_fits({k: v for k, v in need.items() if v}, n.get("Resources", {}))
                   for n in self._ray.nodes() if n.get("Alive") and n.get("NodeID") != lost)

    def _fail_left(self, task: Task, category: str, message: str) -> None:
        for name in task.cells:
            self._answer(name, CellOutcome(wire.FAILED, f"{category}: {message}", category=category))

    def _outcome_of(self, record: dict[str, Any], task: Task) -> CellOutcome:
        """A cell's record as its item reports it: evidence unpacked here, its paths pointing here, what was
        not copied back named (and the ``kept:`` line true when nothing was)."""
        remote_root = str(record.get("root") or "")
        text = str(record.get("text") or "")
        cell_json: CellJson | None = record.get("cell_json")
        refused = [Refused.from_json(r) for r in record.get("evidence_refused") or ()]
        if record.get("evidence") is not None and remote_root:
            unpacked = self._unpack(record["evidence"], remote_root, record.get("kept") or [])
            if unpacked.placed:
                text = text.replace(remote_root, str(self.root))
                cell_json = _replaced(cell_json, remote_root, str(self.root))
            else:
                why = unpacked.refused[-1].why if unpacked.refused else "the archive held nothing"
                nothing = MSG_KEPT_NOTHING.format(node=task.node_name(), why=why)
                kept_line = str(record.get("kept_line") or "")
                text = text.replace(kept_line, nothing) if kept_line and kept_line in text else f"{text}\n{nothing}"
                if cell_json is not None:
                    cell_json[LOST_KEY] = {"node": task.node, "paths": list(record.get("kept") or ()), "why": why}
            # The archive as a whole, when nothing of it could be placed, is named by the kept line alone.
            refused += [r for r in unpacked.refused if unpacked.placed or r.path != THE_ARCHIVE]
        if refused:
            text += "\n" + self._refused_line(refused, task)
            if cell_json is not None:
                cell_json[REFUSED_KEY] = [{**r.to_json(), "path": self._here(r.path)} for r in refused]
        left = record.get("evidence_left")
        if left:
            paths, node = ", ".join(left["paths"]), task.node_name()
            text += "\n" + (MSG_NOT_PACKED.format(node=node, why=left["why"], paths=paths) if left.get("why")
                            else MSG_LEFT_ON_NODE.format(node=node, mb=left["bytes"] / 2**20,
                                                         opt=self.settings.copy_option,
                                                         limit=self.settings.copy_bytes / 2**20, paths=paths))
            if cell_json is not None:
                cell_json[LEFT_KEY] = {"node": task.node, **left}
        # What the node's runs read, compared here without values; the variables the task set are equal.
        differs = differing(record.get("environ") or {}, self.env_key, os.environ, task.spec.get("env", {}))
        return CellOutcome(record["outcome"], text, cell_json, float(record.get("reference_seconds") or 0.0),
                           node=dict(task.node), differs=differs)

    def _here(self, path: str) -> str:
        """Where an entry of the archive (a path relative to the session's folder) lies, or would, here."""
        return path if path == THE_ARCHIVE else str(self.root / path)

    def _refused_line(self, refused: Sequence[Refused], task: Task) -> str:
        entries = "; ".join(MSG_REFUSED_ENTRY.format(path=self._here(r.path), why=r.why, where=MSG_WHERE[r.where])
                            for r in refused[:NAMED])
        if len(refused) > NAMED:
            entries += MSG_REFUSED_MORE.format(count=len(refused) - NAMED, key=REFUSED_KEY)
        return MSG_REFUSED.format(node=task.node_name(), entries=entries)

    def _unpack(self, data: bytes, remote_root: str, kept: Sequence[str]) -> Unpacked:
        """Unpack kept folders into this session's folder (:func:`~.evidence.unpack`: entry by entry, each
        inside one of the cell's kept folders, within the copy limit)."""
        folders = []
        for path in kept:
            try:
                folders.append(str(Path(path).relative_to(remote_root)))
            except ValueError:
                continue
        try:
            with self._unpacking:  # two groups of one case bring the same reference folder
                return unpack(data, self.root, folders, self.settings.copy_bytes)
        except Exception as exc:  # a fault of the harness here: named in the cell's report, the rest goes on
            return Unpacked(0, [Refused(THE_ARCHIVE, WHY_BROKEN.format(error=_first_line(exc)), HERE)])

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


def _resolved(option: str, address: str) -> str:
    """The head's ``host:port`` for ``auto`` as Ray finds it (``RAY_ADDRESS``, else the cluster last started
    on this machine); ``address`` itself otherwise, or where Ray's lookup is not there to ask."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):  # as given: Ray's lookup would turn 127.0.0.1 into this machine's address
        return os.environ["RAY_ADDRESS"]
    try:
        from ray._private import services
    except ImportError:
        return address
    try:
        found = services.canonicalize_bootstrap_address(address)
    except Exception as exc:
        raise ClusterError(ERR_NO_CLUSTER.format(opt=option, error=_first_line(exc))) from None
    if not found:
        raise ClusterError(ERR_NO_CLUSTER.format(opt=option, error="RAY_ADDRESS is unset and no cluster was started "
                                                                   "on this machine"))
    return str(found)


def _check_reachable(option: str, address: str, auto: bool = False) -> None:
    """A head that does not accept a connection within :data:`CONNECT_TIMEOUT` is one error (Ray itself
    would retry for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT):
            return
    except (ValueError, OSError) as exc:
        error = "not host:port" if isinstance(exc, ValueError) else exc.strerror or str(exc)
    if auto:
        error = f"the cluster Ray finds, {address}, does not answer: {error}"
        raise ClusterError(ERR_NO_CLUSTER.format(opt=option, error=error))
    raise ClusterError(ERR_UNREACHABLE.format(opt=option, address=address, error=error))


#: What :func:`_is_node_lost` answers: the task's node went away, or only the worker process it ran in.
LOST_NODE, LOST_WORKER = "node", "worker"


def _is_node_lost(ray: Any, exc: Exception) -> str:
    """Why a task failed when its node or worker process went away (not because of its own code); ``""``
    for any other failure."""
    def kinds(*names: str) -> tuple[type, ...]:
        return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))

    if isinstance(exc, kinds("NodeDiedError", "LocalRayletDiedError")):
        return LOST_NODE
    if isinstance(exc, kinds("WorkerCrashedError", "ObjectLostError")):
        return LOST_WORKER
    return ""


def _fits(need: Mapping[str, float], has: Mapping[str, Any]) -> bool:
    return all(float(has.get(k, 0.0)) >= v for k, v in need.items())


def _plain(resources: Mapping[str, Any]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping ones (memory, object store, node:...)."""
    return {k: float(v) for k, v in resources.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _last_error(tail: Sequence[str]) -> str:
    """The line of a pytest's output that says what went wrong (its ``ERROR:``), else its last line."""
    errors = [ln for ln in tail if ln.startswith("ERROR")]
    return (errors[-1] if errors else tail[-1] if tail else "no output")[:400]


def _replaced(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON data) with ``old`` replaced by ``new`` in every string."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_replaced(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _replaced(v, old, new) for k, v in value.items()}
    return value

