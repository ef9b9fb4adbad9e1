"""Reaching the Ray cluster of ``--resume-matrix-ray`` and naming its nodes: the head's address (``auto`` as
Ray finds it), one :class:`ClusterError` naming the fix for a cluster that cannot be used, connecting as a
driver, the header's line, and what the executor asks of a node (its resources, whether it was lost).
Ray is imported only inside :func:`connect`."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

#: How long a head's address may take to accept a connection before it counts as unreachable.
CONNECT_TIMEOUT = 10.0
#: Ray's namespace for the session's tasks.
NAMESPACE = "pytest-resume-check"

ERR_NO_RAY = ("{opt} needs Ray in this environment and on every node: pip install 'ray[default]' (verl brings it); "
              "{error}")
ERR_UNREACHABLE = ("{opt}={address}: no Ray head answers there ({error}); start the cluster's head "
                   "(ray start --head --port=PORT) or give its address as host:port")
ERR_NO_CLUSTER = ("{opt}=auto: no Ray cluster found for this machine ({error}); start one (ray start --head), join "
                  "this machine to one, set RAY_ADDRESS, or give the head's address")
ERR_CONNECT = "{opt}={address}: connecting to the Ray cluster failed: {error}"
#: The session header's line once connected: where the cells run.
MSG_HEADER = "resume-check: cells run on the Ray cluster at {address}: {count} node{s} alive: {nodes}"

#: What :func:`is_node_lost` answers: the task's node went away, or only the worker process it ran in.
LOST_NODE, LOST_WORKER = "node", "worker"


class ClusterError(Exception):
    """The cluster cannot be used; the message names the fix."""


def connect(option: str, address: str) -> tuple[Any, list[dict[str, Any]]]:
    """Connect to the cluster at ``address`` (given with ``option``) as a driver: the ``ray`` module and the
    nodes alive now, or :class:`ClusterError` naming the fix."""
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(ERR_NO_RAY.format(opt=option, error=exc)) from None
    resolved = _resolved(option, address)
    if not resolved.startswith("ray://") and resolved != "auto":
        _check_reachable(option, resolved, auto=address == "auto")
    try:
        ray.init(address=resolved, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
    except ConnectionError as exc:
        template = ERR_NO_CLUSTER if address == "auto" else ERR_UNREACHABLE
        raise ClusterError(template.format(opt=option, address=address, error=first_line(exc))) from None
    except Exception as exc:
        raise ClusterError(ERR_CONNECT.format(opt=option, address=address, error=first_line(exc))) from None
    return ray, [n for n in ray.nodes() if n.get("Alive")]


def header(address: str, nodes: Sequence[Mapping[str, Any]]) -> str:
    """The session header's line: the cluster's address and its nodes (as ``ray.nodes()`` lists them) with
    their resources."""
    named = "; ".join(f"{node_label(listed(n))} with {amounts(plain(n.get('Resources', {})))}" for n in nodes)
    return MSG_HEADER.format(address=address, count=len(nodes), s="" if len(nodes) == 1 else "s",
                             nodes=named or "none")


def node_label(node: Mapping[str, str]) -> str:
    """``10.0.0.6 (gpu-box-3, node id 430c63a39cbf)``: a node as the reports name it (two nodes may share a
    machine, never an id)."""
    return f"{node.get('ip', '?')} ({node.get('host', '?')}, node id {node.get('node_id', '?')[:12]})"


def listed(node: Mapping[str, Any]) -> dict[str, str]:
    """A node of ``ray.nodes()`` as the tasks describe theirs (:func:`pytest_resume_check.cluster.node.node_info`)."""
    return {"node_id": str(node.get("NodeID", "?")), "ip": str(node.get("NodeManagerAddress", "?")),
            "host": str(node.get("NodeManagerHostname", "?"))}


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
        raise ClusterError(ERR_NO_CLUSTER.format(opt=option, error=first_line(exc))) from None
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


def is_node_lost(ray: Any, exc: Exception) -> str:
    """Why a task failed when its node or worker process went away (not because of its own code); ``""``
    for any other failure."""
    def kinds(*names: str) -> tuple[type, ...]:
        return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))

    if isinstance(exc, kinds("NodeDiedError", "LocalRayletDiedError")):
        return LOST_NODE
    if isinstance(exc, kinds("WorkerCrashedError", "ObjectLostError")):
        return LOST_WORKER
    return ""


def fits(need: Mapping[str, float], has: Mapping[str, Any]) -> bool:
    """Whether a node's resources ``has`` cover what one run ``need``s."""
    return all(float(has.get(k, 0.0)) >= v for k, v in need.items())


def plain(resources: Mapping[str, Any]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping ones (memory, object store, node:...)."""
    return {k: float(v) for k, v in resources.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}


def amounts(resources: Mapping[str, float]) -> str:
    """``CPU 4, GPU 1``: resources as the reports name them."""
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (at most 300 characters)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
