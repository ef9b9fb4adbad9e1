"""How a run's process reports its end on the run's channel: done, or the error its target raised.

One function for every way a run's process ends: its target returning or raising (:mod:`.main`), and a
command program running in the run's process that ends or replaces the process itself (``os._exit``, an
``exec``; :mod:`.in_process`), which must end the run as the end of the program's own process would.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import LAUNCHER_HARNESS, RunPlan
from pytest_resume_check.records.state import Undigestable
from pytest_resume_check.run import Converged

#: Exit code of a run's process whose target raised (its error is on the channel).
EXIT_TARGET_RAISED = 70
#: The first line of a target's error whose traceback :mod:`traceback` could not format (``{error}``: what
#: formatting raised); its frames follow without their source lines, then the error itself as usual.
MSG_UNFORMATTED = "Traceback (most recent call last; formatting it raised {error}, so no source lines):"
#: An error whose ``str()`` raises, as its last line gives its message.
MSG_NO_STR = "<str() of the error raised {error}>"
#: How the ``PROTOCOL`` line of a target whose own ``digest_of(value)`` refused a leaf names the leaf and the call.
DIGEST_OF_ROOT, DIGEST_OF_CALL = "value", "digest_of(value)"


def report_end(plan: RunPlan, sink: Any, body: Callable[[], None]) -> int:
    """Run ``body`` and report how it ended on the run's channel ``sink``: done (under a launcher, a flush: the
    launcher reports done once every rank has finished), nothing more after an early stop, or the error it
    raised; the exit code the run's process ends with."""
    code = 0
    try:
        body()
        if plan.world_size > 1 or plan.launcher != LAUNCHER_HARNESS:
            sink.flush()
        else:
            sink.send(ev.Event(ev.DONE))
    except Converged:
        sink.flush()
    except BaseException as exc:  # report everything, SystemExit included: the parent decides what it means
        if isinstance(exc, Undigestable):  # digest_of(state) met a leaf no digest can be the same in every run
            try:  # the run's PROTOCOL line, judged before how the run ended: not the trainer's crash
                sink.send(ev.Event(ev.VIOLATION, text=exc.message(DIGEST_OF_ROOT, DIGEST_OF_CALL)))
            except OSError:
                pass
        text = error_text(exc)
        # The run's log first when stderr is still that file (a write to it cannot block, and its failure is
        # ignored: on a full disk the pipe still works): the parent stops reading at the error, and must hear
        # before it that the log was lost. A stream the trainer put there instead gets the error after.
        to_log = _is_log(sys.stderr, plan.log_path)
        lost = write_quietly(sys.stderr, text) if to_log else None
        try:
            if lost is not None and lost.errno in FULL:
                sink.send(ev.Event(ev.LOG_LOST, path=plan.log_path, extra={ev.EXTRA_ERRNO: lost.errno}))
            sink.send(ev.Event(ev.ERROR, text=text))
        except OSError:
            pass
        if not to_log:
            write_quietly(sys.stderr, text)
        code = EXIT_TARGET_RAISED
    write_quietly(sys.stdout, "")
    write_quietly(sys.stderr, "")
    return code


def error_text(error: BaseException | None) -> str:
    """The traceback of ``error`` as the parent quotes it. A hostile frame can make :mod:`traceback` itself
    raise (a module whose loader raises when asked for its source; an error whose ``__notes__`` raise): then
    the frames are named from the code objects alone and the error's own line ends it as usual, so the run
    still reports what its target raised instead of dying with multiprocessing's traceback of ours."""
    try:
        return traceback.format_exc()
    except BaseException as exc:  # anything: this text is the last word the run says
        failed = f"{type(exc).__name__}"
    lines = [MSG_UNFORMATTED.format(error=failed)]
    tb = error.__traceback__ if error is not None else None
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        tb = tb.tb_next
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    try:
        message = str(error)
    except BaseException as exc:
        message = MSG_NO_STR.format(error=type(exc).__name__)
    lines.append(f"{name}: {message}" if message else name)
    return "\n".join(lines) + "\n"


def write_quietly(stream: Any, text: str) -> OSError | None:
    """Write and flush, ignoring a log that cannot take it (a full disk) or a stream the target closed; the
    error of a stream that could not take it."""
    try:
        stream.write(text)
        stream.flush()
    except OSError as exc:
        return exc
    except ValueError:
        pass
    return None


#: The errors of a write that mean the disk (or the user's quota) under the run's log is full. The trainer's
#: error is then often that same full disk meeting its output (a ``print`` into the harness's log raises
#: ``ENOSPC``): the harness lost its evidence, and the cell is its failure (:data:`~.events.LOG_LOST`).
FULL = (errno.ENOSPC, errno.EDQUOT)


def _is_log(stream: Any, log_path: str) -> bool:
    """Whether ``stream`` writes to the file at ``log_path``."""
    try:
        mine, log = os.fstat(stream.fileno()), os.stat(log_path)
    except (OSError, ValueError, AttributeError):
        return False
    return (mine.st_dev, mine.st_ino) == (log.st_dev, log.st_ino)
