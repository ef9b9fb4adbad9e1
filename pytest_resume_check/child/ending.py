"""How a run's process reports its end on the run's channel: done, or the error its target raised.

One function for every way a run's process ends: its target returning or raising (:mod:`.main`), and a
command program running in the run's process that ends or replaces the process itself (``os._exit``, an
``exec``; :mod:`.in_process`), which must end the run as the end of the program's own process would.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

from pytest_resume_check.records import events as ev
from pytest_resume_check.records.plan import LAUNCHER_HARNESS, RunPlan
from pytest_resume_check.run import Converged

#: Exit code of a run's process whose target raised (its error is on the channel).
EXIT_TARGET_RAISED = 70


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
    except BaseException:  # report everything, SystemExit included: the parent decides what it means
        text = traceback.format_exc()
        try:  # the pipe first: on a full disk the log write below fails, the pipe does not
            sink.send(ev.Event(ev.ERROR, text=text))
        except OSError:
            pass
        write_quietly(sys.stderr, text)
        code = EXIT_TARGET_RAISED
    write_quietly(sys.stdout, "")
    write_quietly(sys.stderr, "")
    return code


def write_quietly(stream: Any, text: str) -> None:
    """Write and flush, ignoring a log that cannot take it (a full disk) or a stream the target closed."""
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass
