"""What an error of the harness itself means for its user: one ``HARNESS`` line that names what happened
and the fix (a full disk, a session folder another session removed, a file name too long for
the file system and the harness's own bugs were 900-line tracebacks, and the cell vanished from the
reports). The traceback is kept in the cell's folder for a bug report, not shown.

A fork server killed under a run (the kernel's OOM killer picks the largest process, and the server holds
every preloaded module) left the run with multiprocessing's exit status 255, which read as the trainer
dying by itself; it is the harness's failure, named with how the server died.
"""

from __future__ import annotations

import errno
import signal
import traceback
from pathlib import Path

from pytest_resume_check.categories import HARNESS
from pytest_resume_check.process.fork_server import ForkServerDied, MainNotAFile, ServerEnd
from pytest_resume_check.records.names import OPT_ISOLATION
from pytest_resume_check.records.results import Finding

#: The traceback of a harness error, in the cell's folder.
TRACEBACK_FILE = "harness-error.txt"

MSG_DISK_FULL = ("HARNESS: the disk under the session folder {root} is full (No space left on device: {what}); the "
                 "cell was not judged. Free space there, or point --basetemp at a bigger disk")
MSG_FOLDER_GONE = ("HARNESS: the folder {folder} was removed while the cell ran (a second pytest session with the "
                   "same --basetemp clears it when it starts); the cell was not judged. Give each session its own "
                   "--basetemp")
MSG_NAME_TOO_LONG = ("HARNESS: a file name of the cell is too long for the file system ({what}); shorten the "
                     "target's name or its case ids")
MSG_BUG = ("HARNESS: the harness failed while running the cell ({what}); the cell was not judged. This is a bug of "
           "pytest-resume-check: please report it with the traceback{kept}")
MSG_MAIN_NOT_A_FILE = ("HARNESS: the program that drives the harness runs from {path}, which is no file (a program "
                      "read from standard input, or a file removed since it started), and every process "
                      "multiprocessing starts for a run runs that file again first; the cell was not judged. Save "
                      "the program to a file and run that file")
MSG_NO_MAIN_GUARD = ("HARNESS: this program drives the harness at its top level, and every process multiprocessing "
                     "starts for a run runs the program's main file again first: this copy, inside a run, could not "
                     "start runs of its own, and the cell was not judged here (the program's own cells are). Put "
                     "the code that drives the engine under `if __name__ == \"__main__\":`")
MSG_WORKER_CRASHED = ("HARNESS: the pytest-xdist worker running this cell crashed ({what}); the cell was not judged. "
                      "Rerun it alone with its rerun line; a worker that runs out of memory needs fewer workers (-n)")
MSG_SERVER_DIED = ("HARNESS: the fork server the runs start from (pid {pid}) {how} while the cell ran; the cell was "
                   "not judged, and the next runs start a new server. {fix}")
#: How the server died, as :data:`MSG_SERVER_DIED` says it.
HOW_SIGKILL = "was killed by SIGKILL (the kernel's OOM killer sends this)"
HOW_SIGNAL = "was killed by {signal}"
HOW_EXIT = "exited with status {status}"
HOW_UNKNOWN = "ended"
FIX_SERVER_MEMORY = ("If memory ran out (dmesg, or the cgroup's memory.events oom_kill count, says so), run fewer "
                     "pytest-xdist workers (-n) or preload less; then rerun the cell with its rerun line")
FIX_SERVER = ("Rerun the cell with its rerun line; if the server dies again, run with "
              f"{OPT_ISOLATION}=spawn, which needs no fork server")


def server_died(end: ServerEnd) -> str:
    """The ``HARNESS`` line of a run whose fork server died under it (also what a target whose save could not
    be recorded at collection shows)."""
    if end.signal == signal.SIGKILL:
        how, fix = HOW_SIGKILL, FIX_SERVER_MEMORY
    elif end.signal is not None:
        how, fix = HOW_SIGNAL.format(signal=end.signal_name), FIX_SERVER
    elif end.status is not None:
        how, fix = HOW_EXIT.format(status=end.status), FIX_SERVER
    else:
        how, fix = HOW_UNKNOWN, FIX_SERVER
    return MSG_SERVER_DIED.format(pid=end.pid, how=how, fix=fix)


def _what(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def harness_finding(exc: BaseException, root: Path, workdir: Path | None, cell_folder: Path | None = None) -> Finding:
    """The finding of a cell whose running raised ``exc`` inside the harness; its traceback is written to
    ``workdir/harness-error.txt`` when that can be written. ``cell_folder``: the cell's folder, which went
    away while it ran."""
    kept = ""
    if workdir is not None:
        try:
            path = Path(workdir) / TRACEBACK_FILE
            path.write_text("".join(traceback.format_exception(exc)))
            kept = f" in {path}"
        except OSError:
            pass
    chain = _chain(exc)
    died = next((e for e in chain if isinstance(e, ForkServerDied)), None)
    if died is not None:
        return Finding(HARNESS, server_died(died.end))
    main = next((e for e in chain if isinstance(e, MainNotAFile)), None)
    if main is not None:
        return Finding(HARNESS, MSG_MAIN_NOT_A_FILE.format(path=main.path))
    if any(_raised_in(e, "_check_not_importing_main") for e in chain):
        return Finding(HARNESS, MSG_NO_MAIN_GUARD)
    codes = {getattr(e, "errno", None) for e in chain}
    if not Path(root).is_dir() or cell_folder is not None:
        return Finding(HARNESS, MSG_FOLDER_GONE.format(folder=root if not Path(root).is_dir() else cell_folder))
    if errno.ENOSPC in codes or errno.EDQUOT in codes:
        return Finding(HARNESS, MSG_DISK_FULL.format(root=root, what=_what(exc)))
    if errno.ENAMETOOLONG in codes:
        return Finding(HARNESS, MSG_NAME_TOO_LONG.format(what=_what(exc)))
    return Finding(HARNESS, MSG_BUG.format(what=_what(exc), kept=kept))


def _raised_in(exc: BaseException, function: str) -> bool:
    """Whether ``exc`` was raised by a function of that name (the innermost frame of its traceback):
    multiprocessing's check that a process still running its starter's main file again starts none."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == function


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, what caused it, and the errors a ``shutil.Error`` collected (as OSErrors with their errno)."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        if type(exc).__name__ == "Error" and exc.args and isinstance(exc.args[0], list):  # shutil.Error
            for item in exc.args[0]:
                reason = str(item[-1]) if isinstance(item, tuple) and item else ""
                for code in (errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG):
                    if f"[Errno {code}]" in reason:
                        out.append(OSError(code, reason))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out
