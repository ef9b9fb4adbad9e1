"""What a cell run by a group's pytest on a cluster node reports back: one JSON line per cell, appended
to the file named by :data:`STREAM_ENV` as soon as the cell has its outcome (the Ray task reads it as it
grows and passes each record on).

A record: ``name`` (the cell), ``outcome`` (``passed``, ``failed`` with ``text`` the failure report,
``skipped`` with ``text`` the reason, ``error`` with ``text`` pytest's report of an error outside a
verdict), ``cell_json`` (None for an error; its ``rerun`` is that session's command, which the pytest
side replaces with its own), ``reference_seconds``, ``root`` (that session's folder), ``kept`` (the
folders a failing cell keeps), ``kept_line`` (the line of ``text`` that names them) and ``environ`` (each
variable the cell's runs read, with a digest of its value there keyed by :data:`ENV_KEY_ENV`, or None where
it is unset: values never travel). The Ray task adds a failing cell's packed folders (:mod:`.node`).

Stdlib only: the plugin imports this whether or not Ray is installed.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: Set only in a group's pytest on a node: where its records go.
STREAM_ENV = "PYTEST_RESUME_CHECK_RAY_STREAM"
#: Set in a group's pytest and inherited by all it starts: the group's token (the node's sweep finds
#: what is left by it), and it turns ``--resume-matrix-ray`` off there (no task submits tasks).
GROUP_ENV = "PYTEST_RESUME_CHECK_RAY_GROUP"

#: Set only in a group's pytest on a node: the key of the digests of the variables its runs read
#: (:func:`pytest_resume_check.records.environ.digests`), the submitting session's own.
ENV_KEY_ENV = "PYTEST_RESUME_CHECK_RAY_ENV_KEY"

PASSED, FAILED, SKIPPED, ERROR = "passed", "failed", "skipped", "error"


def stream_path() -> str | None:
    """The record file of this process, if it is a group's pytest on a node."""
    return os.environ.get(STREAM_ENV) or None


def env_key() -> str | None:
    """The key of the digests of the variables the runs read, if this process is a group's pytest on a node."""
    return os.environ.get(ENV_KEY_ENV) or None


def in_group() -> bool:
    """Whether this process runs cells for a Ray task."""
    return bool(os.environ.get(GROUP_ENV))


def write(path: str, record: dict[str, Any]) -> None:
    """Append ``record`` as one line (a single write, flushed: the reader never sees half a line it
    would take for whole, as it only takes lines that end)."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def read_new(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines written after byte ``offset``, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end
