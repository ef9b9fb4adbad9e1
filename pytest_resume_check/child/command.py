"""Command targets: the harness runs any program and hears its reports over an inherited socket.

``resume_target.command(argv, ...)`` declares a target whose runs start ``argv`` (placeholders such as
``{checkpoint_dir}`` filled in per run) from the run's child process. The program reports through
:mod:`pytest_resume_check.client` or the line protocol it documents; :func:`run_command`, the target
function of every command target, answers each line by making the same call on the run's
``RunContext``. So kills, crash cells and verdicts are those of Python targets: a kill point blocks the
answer, and the SIGKILL of the run's process group ends the program with its child (the program is in
that group unless it leaves it; then the run's token finds it).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_resume_check import client
from pytest_resume_check.child import cpython, imports, in_process
from pytest_resume_check.child.environ import READS
from pytest_resume_check.child.watch import CALL_WATCHED, CONTEXT_CHECKPOINTS, CONTEXT_COMMIT
from pytest_resume_check.client import CONTEXT_ENV, FD_ENV, PROTOCOL_VERSION
from pytest_resume_check.records import events as ev
from pytest_resume_check.records.commits import matches
from pytest_resume_check.records.errors import TargetError
from pytest_resume_check.records.names import case_id
from pytest_resume_check.records.plan import LAUNCHER_TORCHRUN, CommandSpec
from pytest_resume_check.records.regular_files import NotRegular, open_inside, read_chunks
from pytest_resume_check.records.state import Undigestable, combine
from pytest_resume_check.run import RunContext

#: The folder whose ``sitecustomize`` installs the watcher of zero-change targets in their program.
STARTUP = Path(__file__).parent / "startup"

#: What ``{name}`` in a command's arguments can name (``{case[key]}`` reads one case parameter).
PLACEHOLDERS = ("python", "checkpoint_dir", "resume_mode", "resume_path", "seed", "is_resume", "case", "case_id")

ERR_PLACEHOLDER = ("command target {name!r}: argument {arg!r} {problem}; placeholders are "
                   + ", ".join("{{" + p + "}}" for p in PLACEHOLDERS) + " and {{case[key]}} (write {{{{ and }}}} "
                   "for literal braces)")
ERR_UNWATCHED = ("the command {argv} exited with code 0 and nothing watched its checkpoints: the watcher of "
                 "zero-change targets runs in a Python program started by the interpreter running pytest "
                 "({{python}}) with the PYTHONPATH the harness gives it; start the program so, or report through "
                 "pytest_resume_check.client")
ERR_SILENT = ("the command {argv} exited with code 0 without reporting anything; it must report through "
              "pytest_resume_check.client (run = client.connect(); run.consumed(...); run.step_end(...)) or the "
              "line protocol on the socket in ${fd_env}")


class CommandFailed(Exception):
    """The command exited with an error, or never reported; the run is judged as a target that raised."""


def fill(argv: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """``argv`` with its placeholders filled from ``values`` (raises KeyError, IndexError, ValueError)."""
    return [str(arg).format_map(values) for arg in argv]


def placeholder_values(run: Any) -> dict[str, Any]:
    """The values of the placeholders for one run (``run`` has the RunContext's attributes)."""
    return {"python": sys.executable, "checkpoint_dir": str(run.checkpoint_dir), "resume_mode": run.resume_mode,
            "resume_path": str(run.resume_path or ""), "seed": run.seed, "is_resume": int(bool(run.is_resume)),
            "case": dict(run.case), "case_id": case_id(run.case)}


def check_argv(name: str, argv: Sequence[str], cases: Sequence[Mapping[str, Any]]) -> None:
    """Fill ``argv`` for every case with sample values, so a bad placeholder fails at declaration."""
    class Sample:
        checkpoint_dir, resume_mode, resume_path, seed, is_resume = "/ckpt", "auto", "/ckpt/step_1", 0, False

    for case in cases:
        sample = Sample()
        sample.case = case  # type: ignore[attr-defined]
        for arg in argv:
            try:
                fill([arg], placeholder_values(sample))
            except KeyError as exc:
                problem = f"names {{{exc.args[0]}}}, which is not a placeholder"
                if str(arg).find("{case[") >= 0:
                    problem = f"reads case key {exc.args[0]!r}, which case {dict(case)} does not have"
                raise TargetError(ERR_PLACEHOLDER.format(name=name, arg=arg, problem=problem)) from None
            except (IndexError, ValueError, AttributeError) as exc:
                raise TargetError(ERR_PLACEHOLDER.format(name=name, arg=arg, problem=f"cannot be filled ({exc})")) \
                    from None


def run_command(run: RunContext) -> None:
    """The target function of every command target: start the program, answer its reports."""
    spec = run.plan.command
    if spec is None:
        raise CommandFailed("run_command is the target function of command targets; declare one with "
                            "resume_target.command([...])")
    argv = fill(spec.argv, placeholder_values(run))
    context = {"protocol": PROTOCOL_VERSION, "checkpoint_dir": str(run.checkpoint_dir), "resume_mode": run.resume_mode,
               "resume_path": str(run.resume_path) if run.resume_path else None, "seed": run.seed,
               "case": dict(run.case), "is_resume": run.is_resume,
               "faults": run.plan.faults.to_json() if run.plan.faults is not None else None}
    if spec.checkpoints is not None:  # zero-change: the program's checkpoint files are its reports
        context[CONTEXT_CHECKPOINTS] = spec.checkpoints
        context[CONTEXT_COMMIT] = run.plan.commit
    program = python_program(spec)
    stale = READS.read_when_imported(spec.env) if program is not None else []
    if stale:  # the preloaded modules read these with the server's values: give the program its own import
        run._sink.send(ev.Event(ev.RAN_FRESH, text=",".join(stale)))
        program = None
    if program is not None:
        code, calls = _run_in_process(run, spec, program, argv, context)
    else:
        code, calls = _run_process(run, spec, argv, context)
    _conclude(run, spec, argv, code, calls)


def _conclude(run: RunContext, spec: CommandSpec, argv: list[str], code: int, calls: int) -> None:
    """Judge how the program ended (its exit code, whether it reported) and digest the outputs it delivered."""
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise CommandFailed(f"its last output lines:\n{_tail(run.plan.log_path)}\nthe command {argv} {how}")
    if calls == 0:
        if spec.checkpoints is not None:
            tail = _tail(run.plan.log_path)
            raise CommandFailed(f"its last output lines:\n{tail}\n{ERR_UNWATCHED.format(argv=argv)}")
        raise CommandFailed(ERR_SILENT.format(argv=argv, fd_env=FD_ENV))
    if spec.outputs and run.plan.report_state:  # only where a run's outputs are compared are they read
        outputs = output_digests(run.checkpoint_dir, spec.outputs)
        for name, kind in outputs.refused.items():  # the first is the run's PROTOCOL finding
            run._send(ev.Event(ev.VIOLATION, text=MSG_OUTPUT_REFUSED.format(name=name, kind=kind)))
        run.final(outputs.digests)
        missing = missing_outputs(run.checkpoint_dir, spec.outputs)
        if missing:  # say which were not there
            run._send(ev.Event(ev.FINAL, extra={ev.FINAL_MISSING: missing}))


#: What a declared output that a run did not write digests to.
MISSING = "missing"
#: What a declared output the harness refused to read digests to (:data:`MSG_OUTPUT_REFUSED` says why).
REFUSED = "refused"
#: A declared output that is no regular file inside the run's folder, after "run 2 of 3" or "the reference run"
#: in the cell's ``PROTOCOL`` headline (``kind``: what it is instead, :mod:`~.records.regular_files`).
MSG_OUTPUT_REFUSED = ("delivered {name}, which is {kind}: outputs= digests only regular files inside "
                      "{{checkpoint_dir}} (a symbolic link may lead to one there); deliver {name} as a regular file")


@dataclass(frozen=True)
class Outputs:
    """A run's final outputs: each file's digest by its path (relative to the run's folder, ``/``-separated),
    and the paths refused, each with what it is instead of a regular file inside the folder."""

    digests: dict[str, str]
    refused: dict[str, str]


def output_digests(folder: str | os.PathLike[str], patterns: Sequence[str]) -> Outputs:
    """The final outputs of a run: each file matching one of ``patterns`` (globs relative to ``folder``; a
    folder stands for the files in it) by its path, with the SHA-256 of its bytes; a pattern that matches
    nothing is its own component, :data:`MISSING` (:func:`missing_outputs` says where it was expected).

    Only regular files inside ``folder`` are read (:func:`~.records.regular_files.open_inside`): a symbolic
    link is followed while it leads to a file or folder inside it; a FIFO, a device, a socket or a link out of
    the folder is refused (:data:`REFUSED`, and named in ``refused``), never read."""
    root = str(folder)
    out = Outputs({}, {})
    for pattern in patterns:
        paths = sorted(Path(root).glob(pattern))
        if not paths:
            out.digests[pattern] = MISSING
        walked: set[tuple[int, int]] = set()
        for path in paths:
            _digest_into(root, path.relative_to(root).as_posix(), out, walked)
    return out


def _digest_into(root: str, rel: str, out: Outputs, walked: set[tuple[int, int]]) -> None:
    """Add the file ``rel`` names inside ``root`` to ``out``, or every file of the folder it names (each folder
    once, by its inode in ``walked``: a link back to a folder above it ends there)."""
    try:
        fd = open_inside(root, rel)
    except NotRegular as refused:
        out.digests[rel], out.refused[rel] = REFUSED, refused.kind
        return
    except FileNotFoundError:  # gone since the glob saw it
        out.digests[rel] = MISSING
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode):
            out.digests[rel] = _file_digest(fd)
            return
        if (info.st_dev, info.st_ino) in walked:
            return
        walked.add((info.st_dev, info.st_ino))
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    for name in names:
        _digest_into(root, f"{rel}/{name}", out, walked)


def missing_outputs(folder: str | os.PathLike[str], patterns: Sequence[str]) -> dict[str, str]:
    """The patterns of ``patterns`` that match nothing in ``folder``, each with the path it was expected at."""
    root = Path(folder)
    return {pattern: str(root / pattern) for pattern in patterns if not any(root.glob(pattern))}


def _file_digest(fd: int) -> str:
    digest = hashlib.sha256()
    for chunk in read_chunks(fd):
        digest.update(chunk)
    return digest.hexdigest()


def _run_process(run: RunContext, spec: CommandSpec, argv: list[str], context: dict[str, Any],
                 executable: str | None = None, environ: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> tuple[int, int]:
    """Start the program as a process of its own with the socket; its exit code and how many calls it made.
    ``executable``, ``environ`` and ``cwd``: those of a program an in-process program ``exec``s (else the
    command's, with its ``env=`` over this process's environment)."""
    ours, theirs = socket.socketpair()
    base = dict(environ) if environ is not None else {**os.environ, **dict(spec.env)}
    env = {**base, FD_ENV: str(theirs.fileno()), CONTEXT_ENV: json.dumps(context)}
    if spec.checkpoints is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(STARTUP), *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.Popen(argv, executable=executable, cwd=cwd or spec.cwd, env=env,
                                pass_fds=(theirs.fileno(),))
    except OSError as exc:
        if executable is not None:
            ours.close()
            raise  # what the program's exec raises
        raise CommandFailed(f"the command {argv} could not start: {exc}") from exc
    finally:
        theirs.close()
    previous = signal.getsignal(signal.SIGTERM)
    forwarding = _forward_term(run, proc)
    try:
        calls = _serve(run, ours, proc)
        code = proc.wait()
    finally:
        if forwarding:  # None: a handler not set from Python, which the default stands for
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if proc.poll() is None:  # the run stopped early (converged, step limit, an error): end the program too
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        ours.close()
    return code, calls


#: Seconds a program gets to end after the SIGTERM its torchrun worker passed on, before it is killed with
#: the worker. Bounds only how long a stopped group of an in-job restart takes to go (torchrun's own wait
#: for stopped workers is 30 s); a program without a handler ends at once.
TERM_GRACE = 5.0


def _forward_term(run: RunContext, proc: subprocess.Popen[bytes]) -> bool:
    """Under torchrun the program stands for the worker torchrun started: it is reported with its
    worker, so a lost node's programs die with it, and the SIGTERM torchrun's agent sends the worker when it
    stops the group (an in-job restart) is passed on to the program, which gets :data:`TERM_GRACE` seconds
    to end; then the worker ends by that signal, as the program would have. Else a stopped worker's program
    would go on beside the restart's workers, writing into the same checkpoint folder. Whether it installed
    the handler (not under another launcher, nor off the main thread)."""
    if run.plan.launcher != LAUNCHER_TORCHRUN or threading.current_thread() is not threading.main_thread():
        return False
    run._send(ev.Event(ev.RANKS, extra={"program": proc.pid, "worker": os.getpid()}))

    def forward(signum: int, frame: Any) -> None:
        _signal_quietly(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE
        while time.monotonic() < deadline and _running(proc.pid):
            time.sleep(0.01)
        _signal_quietly(proc.pid, signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    return True


def _signal_quietly(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    """Whether child ``pid`` has not ended (reaped here: this process ends right after)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


#: How a Python program is named after ``{python}``: a script's path, or ``-m`` and a module.
SCRIPT, MODULE = "script", "module"
#: The package whose import says a program reports through the client (which works in the run's process).
CLIENT_PACKAGE = "pytest_resume_check"


@functools.lru_cache(maxsize=64)
def python_program(spec: CommandSpec) -> tuple[str, str] | None:
    """(:data:`SCRIPT`, path) or (:data:`MODULE`, name) when the command is ``{python} script.py ...`` or
    ``{python} -m module ...`` (placeholders allowed after it) of a program that reports through
    ``pytest_resume_check.client`` (it imports it) or reports nothing (``checkpoints=``): such a program may
    run in the run's own process. None when it needs a process of its own: another program, interpreter
    options or ``PYTHON*`` variables in ``env``, one that speaks the line protocol on the socket itself,
    ``fresh_interpreter=True``."""
    named = _named_program(spec)
    if named is None or spec.fresh_interpreter or any(key.startswith("PYTHON") for key, _ in spec.env):
        return None  # PYTHONPATH and the like change how an interpreter starts: give it one
    source = _source(spec, named)
    if source is None:
        return None
    if spec.checkpoints is None and CLIENT_PACKAGE not in imports.imported_names(source[1], anywhere=True):
        return None
    return named


def _named_program(spec: CommandSpec) -> tuple[str, str] | None:
    argv = spec.argv
    if len(argv) < 2 or argv[0] != "{python}" or "{" in argv[1]:
        return None
    if argv[1] == "-m":
        return (MODULE, argv[2]) if len(argv) > 2 and "{" not in argv[2] and not argv[2].startswith("-") else None
    return (SCRIPT, argv[1]) if argv[1].endswith(".py") else None


@functools.lru_cache(maxsize=64)
def _source(spec: CommandSpec, named: tuple[str, str]) -> tuple[Path, ast.Module] | None:
    """The program's file and its parsed source (None when it cannot be found, read or parsed). Reading it
    imports nothing but the packages above a ``-m`` module."""
    kind, name = named
    try:
        if kind == MODULE:
            found = importlib.util.find_spec(name)
            if found is None or not found.origin or not found.origin.endswith(".py"):
                return None
            path = Path(found.origin)
        else:
            path = Path(spec.cwd or os.getcwd()) / name
        return path, ast.parse(path.read_bytes())
    except (ImportError, ValueError, OSError, SyntaxError):
        return None


@functools.lru_cache(maxsize=64)
def program_imports(spec: CommandSpec) -> list[tuple[str, str]]:
    """The installed packages a program that runs in the run's process (:func:`python_program`) imports
    anywhere in its source, or in its own modules' (one level), as (top-level name, file): the fork server
    imports them for it, as it imports a Python target's module (``auto_preload``); one that fails there is
    left to the runs, as for any module ``auto_preload`` cannot import. Its own modules (beside the script, or
    in the working folder) are left to each run: importing them may have effects. Read from the source;
    nothing is imported here (:func:`~pytest_resume_check.child.imports.installed_imports`)."""
    named = python_program(spec)
    source = _source(spec, named) if named is not None else None
    if source is None:
        return []
    path, tree = source
    return imports.installed_imports(tree, path, Path(spec.cwd or os.getcwd()))


def _run_in_process(run: RunContext, spec: CommandSpec, program: tuple[str, str], argv: list[str],
                    context: dict[str, Any]) -> tuple[int, int]:
    """Run a Python program in this process, forked from the fork server that already imported what it
    imports (a fresh interpreter importing torch cost 3.4 s a run), as a fresh interpreter would
    run it (:mod:`pytest_resume_check.child.in_process`): its ``sys.argv``, ``__main__``, ``__file__``,
    ``sys.path[0]``, working folder and environment; its ``client.connect()`` returns a context whose calls go
    straight to this run's ``RunContext`` (the same answers the socket would carry); a zero-change program's
    watcher is installed around it; the exit functions it registers run when it ends, after the threads it
    started and did not make daemons; ``os._exit``, ``exec`` and ``fork`` act as in a process of its own. Its
    exit code and how many calls it made."""

    from pytest_resume_check.child import watch

    os.chdir(spec.cwd or os.getcwd())
    os.environ.update(dict(spec.env))
    os.environ[CONTEXT_ENV] = json.dumps(context)
    local = LocalRun(run, context)
    client._in_process = local
    cpython.clear_exit_functions()  # what the fork server registered is not the program's
    in_process.register_import_exits()  # but what its imports register, they would in a fresh interpreter
    if spec.checkpoints is not None:
        watch.start(local, spec.checkpoints, recorder=run._recorder, commit=run.plan.commit)
    kind, name = program
    sys.argv = [name, *argv[3 if kind == MODULE else 2:]]
    before = set(threading.enumerate())
    hooks = cpython.threading_exit_hooks()  # what concurrent.futures registers at exit

    def conclude(code: int, calls: int) -> None:
        _conclude(run, spec, argv, code, local.calls + calls)

    def start(executable: str, args: list[str], env: Mapping[str, str]) -> tuple[int, int]:
        return _run_process(run, spec, args, context, executable=executable, environ=env, cwd=os.getcwd())

    watch_imports = None
    if run.plan.report_imports:  # for the note naming what the runs import themselves, once per target
        here = Path(os.getcwd())
        watch_imports = imports.ImportWatch([here / Path(name).parent, here] if kind == SCRIPT else [here])
        watch_imports.start()
    with in_process.OwnProcess(run.plan, run._sink, conclude, start) as own:
        code = in_process.run_main(name, kind == MODULE, own.home)
        if watch_imports is not None and os.getpid() == own.home:  # not in a process the program forked
            run._sink.send(ev.Event(ev.IMPORTED, extra={ev.IMPORTED_NAMES: watch_imports.stop()}))
        try:
            in_process.end_as_interpreter(before, hooks)
        finally:
            own.end_if_forked(code)
    return code, local.calls


class LocalRun(client.Run):
    """The client's run context of a program running in the run's own process: each call is the line the
    socket would carry, answered by the ``RunContext`` directly (:func:`_reply`), and counted. It records no
    file operations itself: the run's recorder sees the program's saves."""

    def __init__(self, run: RunContext, context: Mapping[str, Any]):
        super().__init__({**context, "faults": None})
        self.active = True
        self.calls = 0
        self._run = run

    def _call(self, call: str, **fields: Any) -> Any:
        self.calls += 1
        answer = _reply(self._run, json.dumps({"call": call, **fields}).encode("utf-8"))
        if not answer["ok"]:
            raise client.ProtocolError(f"resume-check refused {call}: {answer['error']}")
        return answer.get("value")


def _tail(log_path: str, lines: int = 15) -> str:
    """The last lines the program wrote (its output shares the run's log file), so the run's error carries
    the program's own traceback (an injected I/O error is recognised by its text)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "    (the log cannot be read)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


#: Seconds between checks whether the program exited while its socket stays open (a process it forked holds
#: the other end: the program is done when it exits, whatever its children hold).
EXIT_POLL = 0.2
#: The longest line the harness reads; a longer one is a protocol violation (state digests are short).
MAX_LINE = 16 * 1024 * 1024
#: What a line that cannot be a call raises while it is decoded and dispatched: deep nesting overflows the
#: decoder's recursion, ``1e400`` is infinity, which is no step number.
_BAD_LINE = (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError)


def _serve(run: RunContext, sock: socket.socket, proc: subprocess.Popen[bytes]) -> int:
    """Answer the program's lines until it closes its end or exits (then what it wrote before it exited is
    answered too); returns how many calls it made."""
    buffer = bytearray()
    calls = 0
    skipping = False  # the rest of a line that was too long
    while True:
        ready, _, _ = select.select([sock], [], [], EXIT_POLL)
        if not ready:
            if proc.poll() is None:
                continue
            sock.setblocking(False)  # exited: take what is already there, wait for nothing more
            try:
                chunk = sock.recv(1 << 20)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                break
        else:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            if skipping:  # the end of the line that was too long: answered already
                skipping = False
                continue
            calls += 1
            _answer(run, sock, line)
        if len(buffer) > MAX_LINE and not skipping:
            calls += 1
            _answer(run, sock, bytes(buffer[:200]), f"sent a line longer than {MAX_LINE} bytes")
            skipping = True
        if skipping:
            buffer.clear()  # dropped up to the line's end
    if buffer.strip() and not skipping:
        calls += 1
        _answer(run, sock, bytes(buffer))
    return calls


def _answer(run: RunContext, sock: socket.socket, raw: bytes, problem: str | None = None) -> None:
    """Make the call ``raw`` names and send the program its answer (:func:`_reply`)."""
    answer = _reply(run, raw, problem)
    try:
        sock.setblocking(True)
        sock.sendall((json.dumps(answer) + "\n").encode("utf-8"))
    except OSError:  # the program is gone; its calls so far are recorded
        pass


def _reply(run: RunContext, raw: bytes, problem: str | None = None) -> dict[str, Any]:
    """Make the call the line ``raw`` names; the answer for the program. A line that is no call is a protocol
    violation the program is told about."""
    try:
        if problem is not None:
            raise ValueError(problem)
        request = json.loads(raw)
        if not isinstance(request, dict):
            raise TypeError(f"a line must be a JSON object, not {type(request).__name__}")
        answer: dict[str, Any] = {"ok": True, "value": _dispatch(run, request)}
    except _BAD_LINE as exc:
        what = f"{type(exc).__name__}: {str(exc)[:200]}"
        text = (f"sent {raw[:200].decode('utf-8', 'replace').strip()!r}, which is not a call of the protocol "
                f"({what}); each line is one JSON object such as " '{"call": "step_end", "step": 3}')
        run._violation(text)
        answer = {"ok": False, "error": text}
    return answer


#: Calls only the client makes, and only in crash cells (where it records the program's own save).
INTERNAL_CALLS = ("file_op", "kill_ready", "lane_ready")


def _dispatch(run: RunContext, request: Mapping[str, Any]) -> Any:
    call = request["call"]
    step: Any = request.get("step")  # any JSON value: int() rejects a missing or wrong one (a violation)
    if call in INTERNAL_CALLS and run.plan.faults is None:
        raise ValueError(f"{call!r} is the client's own call in crash cells; a program does not make it")
    if call == "resumed":
        run.resumed(int(step), request.get("path"))
    elif call in ("consumed", "trained"):
        getattr(run, call)(request["ids"], step=int(step), epoch=int(request["epoch"]))
    elif call == "step_end":
        run.step_end(int(step))
    elif call == "should_checkpoint":
        return run.should_checkpoint(int(step))
    elif call == "checkpoint_published":
        run.checkpoint_published(int(step), request.get("path"))
    elif call in ("state", "final"):
        _state(run, call, step, request)
    elif call == "log":
        run.log(str(request["text"]))
    elif call == "file_op":
        run._send(ev.Event(ev.FILE_OP, path=request["path"], text=request["kind"],
                           extra={"index": request["index"], "target": request.get("target"),
                                  "lane": request.get("lane")}))
    elif call == "kill_ready":
        run._await_kill(str(request["text"]), dict(request.get("extra") or {}))
    elif call == "lane_ready":
        run._say_ready(str(request["text"]), dict(request.get("extra") or {}))
    elif call == CALL_WATCHED:
        _watched(run, request)
    else:
        raise ValueError(f"unknown call {call!r}")
    return None


ERR_WATCHED = (f"{CALL_WATCHED!r} is the watcher's own call for a program declared with checkpoints=; a program does "
               "not make it")


def _watched(run: RunContext, request: Mapping[str, Any]) -> None:
    """What the watcher of a zero-change program saw (a commit, a pointer, a folder filled in place): the event
    of its kind, for the judging and the reference (see :mod:`pytest_resume_check.child.watch`)."""
    command = run.plan.command
    kind = request["kind"]
    if command is None or command.checkpoints is None or kind not in ev.WATCHED_KINDS:
        raise ValueError(ERR_WATCHED)
    step, path, extra = request.get("step"), request.get("path"), request.get("extra") or {}
    run._send(ev.Event(kind, step=int(step) if step is not None else None, path=str(path) if path else None,
                       extra=dict(extra)))


#: The field of a ``state`` or ``final`` line that carries the program's own digests: per component, each leaf's
#: path and digest as :func:`pytest_resume_check.records.state.leaf_digests` gives them, computed in the program
#: where the values live (a torch optimizer's tensors cannot travel as JSON). The leaves keep their names, so the
#: headline names the first differing one, ``optimizer differs (state.0.momentum_buffer)``, as for a Python
#: target reporting the same state; a component sent as one digest of the program's own has no leaf
#: to name.
FIELD_LEAVES = "leaves"
ERR_LEAVES = ("{call} leaves must be a JSON object of components, each an object of leaf paths and their digests "
              "(strings), as pytest_resume_check.records.state.leaf_digests gives them")
ERR_BOTH = "a {call} line carries components or leaves, not both"
ERR_LEAVES_TOLERANCE = ("this target compares its state under a tolerance (state_tolerance=...), which needs the "
                        "values: send them as components, not as digested leaves")


#: The field of a ``state`` or ``final`` line by which the client says a leaf cannot be digested the same way in
#: every run (:class:`~pytest_resume_check.records.state.Undigestable`): ``keys`` (the component's name first),
#: ``type`` and ``why``. The run's ``PROTOCOL`` line names it, as for a Python target reporting the same state.
FIELD_REFUSED = "refused"


def _state(run: RunContext, call: str, step: Any, request: Mapping[str, Any]) -> None:
    """A ``state`` or ``final`` line: JSON values the harness digests here (``components``), or leaves the program
    digested itself (:data:`FIELD_LEAVES`), reported as the same event a Python target's call makes; a leaf the
    program could not digest (:data:`FIELD_REFUSED`) is the run's ``PROTOCOL`` line."""
    if FIELD_REFUSED in request:
        refused = request[FIELD_REFUSED]
        if run.plan.report_state:
            run._refused(ev.STATE if call == "state" else ev.FINAL, int(step) if call == "state" else None,
                         Undigestable(tuple(refused["keys"]), str(refused["type"]), str(refused["why"])))
        return
    if FIELD_LEAVES not in request:
        components = request["components"]
        if not isinstance(components, dict):
            raise TypeError(f"{call} components must be a JSON object")
        if call == "state":
            run.state(int(step), components)
        else:
            run.final(components)
        return
    if "components" in request:
        raise ValueError(ERR_BOTH.format(call=call))
    leaves = _leaves(call, request[FIELD_LEAVES])
    at = int(step) if call == "state" else None
    if not run.plan.report_state:
        return  # a run whose state nobody compares (a first run that will be killed), as RunContext.state
    if run.plan.state_tolerance is not None:
        raise ValueError(ERR_LEAVES_TOLERANCE)
    # What RunContext.state and .final send for components whose leaves digest to these.
    digests = {name: combine(values) for name, values in leaves.items()}
    run._send(ev.Event(ev.STATE if at is not None else ev.FINAL, step=at,
                       extra={ev.STATE_DIGESTS: digests, ev.STATE_LEAVES: leaves}))
    if at is not None:
        run._check_converged(at, digests)  # an early stop ends the run here, as for a Python target


def _leaves(call: str, value: Any) -> dict[str, dict[str, str]]:
    """The ``leaves`` of a line, checked: components of leaf paths and digests, all strings."""
    if not isinstance(value, dict) or not all(
            isinstance(leaves, dict) and all(isinstance(k, str) and isinstance(d, str) for k, d in leaves.items())
            for leaves in value.values()):
        raise TypeError(ERR_LEAVES.format(call=call))
    return {str(name): dict(leaves) for name, leaves in value.items()}


ERR_GLOB = ("command target {name!r}: {option}={value!r} {problem}; give {what} as a glob relative to the run's "
            "checkpoint folder ({{checkpoint_dir}}), e.g. {example}")
ERR_COMMIT_ALONE = ("command target {name!r}: commit={value!r} names the file that commits a checkpoint of a program "
                    "that reports nothing; declare where its checkpoints appear too, e.g. checkpoints='ckpt_*.pt'")
ERR_COMMIT_IS_CHECKPOINT = ("command target {name!r}: commit={value!r} matches checkpoints={glob!r}; the commit point "
                            "is the pointer or tracker file that names a checkpoint, not a checkpoint itself")


def _glob(name: str, option: str, value: Any, what: str, example: str) -> str:
    """A glob relative to the checkpoint folder, checked."""
    problem = None
    if not isinstance(value, str) or not value.strip():
        problem = "is not a non-empty string"
    elif os.path.isabs(value) or ".." in Path(value).parts:
        problem = "leaves the checkpoint folder"
    elif "{" in value:
        problem = "holds a placeholder, which globs do not take"
    if problem is not None:
        raise TargetError(ERR_GLOB.format(name=name, option=option, value=value, problem=problem, what=what,
                                          example=example))
    return Path(value).as_posix()


def command_spec(name: str, argv: Sequence[str], cwd: str | os.PathLike[str] | None, env: Mapping[str, str] | None,
                 cases: Sequence[Mapping[str, Any]], declared_in: str | None, checkpoints: str | None = None,
                 outputs: Sequence[str] = (), fresh_interpreter: bool = False,
                 commit: str | None = None) -> CommandSpec:
    """Validate a command target's program and where it runs (relative to the declaring file's folder), and
    for a zero-change target where its checkpoints, its commit point and its outputs appear."""

    if isinstance(argv, (str, bytes)) or not argv:
        raise TargetError(f"command target {name!r}: give the command as a list of arguments, e.g. "
                          "['{python}', 'train.py', '--out', '{checkpoint_dir}'], not "
                          f"{argv!r}")
    check_argv(name, argv, cases)
    base = Path(declared_in).parent if declared_in else Path.cwd()
    folder = base / cwd if cwd is not None else base
    if not folder.is_dir():
        raise TargetError(f"command target {name!r}: cwd {str(folder)!r} is not a folder; give cwd= relative to "
                          f"{base} or absolute")
    if checkpoints is not None:
        checkpoints = _glob(name, "checkpoints", checkpoints, "where its checkpoints appear", "'step_*.pt'")
    if commit is not None:
        if checkpoints is None:
            raise TargetError(ERR_COMMIT_ALONE.format(name=name, value=commit))
        commit = _glob(name, "commit", commit, "the pointer or tracker file it writes once a checkpoint is complete",
                       "'latest.txt'")
        if matches(commit.replace("/", os.sep), checkpoints):
            raise TargetError(ERR_COMMIT_IS_CHECKPOINT.format(name=name, value=commit, glob=checkpoints))
    if isinstance(outputs, (str, bytes)):
        outputs = [outputs]
    globs = tuple(_glob(name, "outputs", o, "each file it delivers", "['model.pt']") for o in outputs)
    return CommandSpec(tuple(str(a) for a in argv), str(folder.resolve()),
                       tuple((str(k), str(v)) for k, v in (env or {}).items()), checkpoints, globs,
                       bool(fresh_interpreter), commit)
