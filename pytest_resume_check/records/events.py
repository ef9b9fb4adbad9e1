"""Event types a child run sends to its supervisor, and their wire format.

Each event is one JSON object on the event channel. The child writes an event the moment it happens,
so a SIGKILL can only lose events that were never written.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

#: Event kinds.
CONSUMED = "consumed"
TRAINED = "trained"
STEP_END = "step_end"
CHECKPOINT = "checkpoint"
RESUMED = "resumed"
KILL_READY = "kill_ready"
LOG = "log"
#: How a ``run.log`` line starts in the run's log file (where it also goes, beside stdout and stderr).
LOG_PREFIX = "[run.log] "
#: The line the supervisor writes into a hung run's log before each process's stacks; ``who`` is
#: ``rank R, `` in a multi-rank run, empty otherwise. :data:`STACKS_HEADER_PATTERN` reads it back.
STACKS_HEADER = "[resume-check] stacks of {who}pid {pid}, written when the run hung, before it was killed:"
STACKS_HEADER_PATTERN = re.compile(r"^\[resume-check\] stacks of (?:rank (?P<rank>\d+), )?pid (?P<pid>\d+), "
                                   r"written when the run hung, before it was killed:$", re.MULTILINE)


def stacks_header(rank: int | None, pid: int) -> str:
    """The line above the stacks of process ``pid`` (rank ``rank`` of a multi-rank run) in a run's log."""
    return STACKS_HEADER.format(who="" if rank is None else f"rank {rank}, ", pid=pid)

ERROR = "error"
DONE = "done"
STATE = "state"  # extra: the trainer's state after a step by component (see RunContext.state)
PAUSED = "paused"  # the child waits for the supervisor to snapshot its checkpoint directory
CONVERGED = "converged"  # the resumed run's state equals the reference's at this step; it stopped
FINAL = "final"  # extra as a state event's: what the job delivers at the end of training (RunContext.final)
#: text: a reporting rule the run broke (a call out of order, bytes on the channel that are no event); the
#: cell is judged ``PROTOCOL``. The wire value keeps the category's word.
VIOLATION = "protocol"
#: The run's process could not write the run's log, the harness's own file (``path``; extra
#: :data:`EXTRA_ERRNO`: a full disk or quota): the run's evidence is lost, which is the harness's failure.
LOG_LOST = "log_lost"
EXTRA_ERRNO = "errno"
FILE_OP = "file_op"  # a file operation of the watched save (path, extra: index, kind, target)
RANKS = "ranks"  # a multi-rank run's launcher started its ranks (extra: pids, by rank)
#: Written by the supervisor, not a child: what it did to the run (extra: signal, grace, rank, pid).
SIGNALLED = "signalled"
#: extra: how the framework in the run is set up, as plain values (RunContext.settings); nothing compares
#: them, the report reads them to tell whether a framework's known bug can be what a failing cell shows.
SETTINGS = "settings"
#: What the watcher of a zero-change program saw (:mod:`pytest_resume_check.child.watch`), each with ``path``
#: the checkpoint concerned: a commit point (a pointer or tracker file, ``extra`` :data:`EXTRA_FILE`) got its
#: final name naming that checkpoint, right before the publication it makes (``step``; ``extra``
#: :data:`EXTRA_COMPLETE`: whether the checkpoint was complete then); where no commit point is followed, a
#: small file that is no checkpoint got its final name naming one (``POINTER``), and a checkpoint folder got
#: files written into it in place before any final name (``IN_PLACE``).
COMMIT = "commit"
POINTER = "pointer"
IN_PLACE = "in_place"
#: Keys of a commit's or pointer's ``extra``: the file (relative to the checkpoint folder) and, for a commit,
#: whether the checkpoint it named existed with no write to it still open.
EXTRA_FILE = "file"
EXTRA_COMPLETE = "complete"
#: Key of a final event's ``extra``: the declared outputs a run did not deliver, each with where it was expected.
FINAL_MISSING = "missing"
#: text: an environment variable the project's own code read in the run (each name once; see
#: :mod:`pytest_resume_check.records.environ`).
ENVIRON = "environ"
#: text: the ``env=`` variables (comma-separated) for which a command target's Python program ran in a fresh
#: interpreter instead of the run's process: code the fork server imported read them with another value.
RAN_FRESH = "ran_fresh"
#: extra :data:`IMPORTED_NAMES`: the packages (top-level names, in the order imported) a command target's Python
#: program imported in the run's process that the fork server had not, each as the program asked for it.
IMPORTED = "imported"
IMPORTED_NAMES = "names"

#: Keys of a state event's ``extra``: component digests, their leaves' digests by path, and (under a
#: tolerance) the first leaf per component that is not close to the reference's (None: all close).
STATE_DIGESTS = "digests"
STATE_LEAVES = "leaves"
STATE_COMPARED = "compared"
#: Key of a state event's ``extra`` (True) for the generators the harness captured as the step after
#: ``step`` took its first inputs (the state a resume of ``step`` continues from; see RunContext.consumed).
STATE_BEFORE_NEXT = "before_next"

KINDS = frozenset({CONSUMED, TRAINED, STEP_END, CHECKPOINT, RESUMED, KILL_READY, LOG, ERROR, DONE, STATE,
                   PAUSED, CONVERGED, FINAL, FILE_OP, VIOLATION, RANKS, SIGNALLED, SETTINGS, COMMIT, POINTER, IN_PLACE,
                   ENVIRON, RAN_FRESH, IMPORTED, LOG_LOST})
#: What the watcher reports (the kinds of its ``watched`` call, :mod:`pytest_resume_check.child.command`).
WATCHED_KINDS = (COMMIT, POINTER, IN_PLACE)


@dataclass(frozen=True)
class Event:
    """One thing that happened in a child run.

    ``ids`` is set for consumed/trained events, ``step`` for every step-related event, ``epoch`` for
    consumed/trained events, ``path`` for checkpoint/resumed events and ``text`` for log, error and
    kill-ready events. ``rank`` is set by the ranks of a multi-rank run (None: a one-process run);
    ``attempt`` by the workers of a torchrun job that torchrun restarted inside the run (the round of its
    rendezvous they were started in, which a node joining counts too, unlike ``TORCHELASTIC_RESTART_COUNT``;
    None: the job's first attempt, or an event of the launcher or the supervisor, which belongs to the
    attempt of the event before it).
    """

    kind: str
    step: int | None = None
    epoch: int | None = None
    ids: tuple[Any, ...] = ()
    path: str | None = None
    text: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    attempt: int | None = None

    def to_wire(self) -> bytes:
        """Encode as one JSON line."""
        data = {k: v for k, v in asdict(self).items() if v not in (None, (), {})}
        if self.ids:
            data["ids"] = list(self.ids)
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_wire(cls, raw: bytes) -> Event:
        """Decode one JSON line written by :meth:`to_wire`."""
        data = json.loads(raw)
        kind = data.get("kind")
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r} on the event channel")
        data["ids"] = tuple(_freeze(i) for i in data.get("ids", ()))
        return cls(**data)


def _freeze(value: Any) -> Any:
    """JSON turns tuples into lists; ids must stay hashable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
