"""A small client program that ends its process in one of the ways real scripts do, run as a command target
both in the run's process and in a fresh interpreter (``python fresh_equivalence_program.py MODE OUT``): the
two must be judged alike. It trains :data:`STEPS` steps of one input each, saves ``step_<n>.json`` every
second step (or when the harness asks; every step when it reports nothing) and resumes from the newest;
``MODE`` is what it does besides (:data:`MODES`)."""

from __future__ import annotations

import atexit
import glob
import json
import os
import sys

from pytest_resume_check import client

STEPS = 4
#: What each mode does, for the test's ids and a reader.
MODES = {
    "plain": "nothing else",
    "fork_exit": "forks a child after step 1 that ends with sys.exit(0)",
    "fork_raise": "forks a child after step 1 that raises",
    "fork_early": "forks a child before it connects that ends with sys.exit(0)",
    "exit_after_last": "os._exit(0) after its last report, skipping its teardown",
    "exit_mid": "os._exit(0) after step 1, as if done",
    "exit_code": "os._exit(5) after step 2",
    "exit_on_resume": "os._exit(0) in a resumed run right after it reports what it restored",
    "chdir_file": "changes folder, then reads a file beside itself through __file__",
    "stdout_closed": "closes sys.stdout after its last step",
    "exec_wrapper": "execs `python this_file plain OUT` before it reports",
    "argv": "checks the sys.argv and __file__ a fresh interpreter gives it",
    "atexit_raises": "registers an exit function that raises",
    "zc_plain": "reports nothing (a zero-change target: the harness watches its checkpoints)",
    "zc_fork_exit": "reports nothing, and forks a child before it trains that ends with sys.exit(0)",
    "mp_output": "a multiprocessing child that is no daemon writes its output model.json after main returns",
    "mp_joined": "a multiprocessing child that is no daemon writes model.json and is joined before main returns",
    "thread_output": "a thread that is no daemon writes model.json after main returns",
    "signals": "checks the signal handlers a fresh interpreter starts with, then handles a signal of its own",
    "warnings": "checks that the default warning filters show a DeprecationWarning of __main__ and no other",
    "faulthandler": "enables faulthandler on its stderr and dumps its own traceback",
    "rlimit": "raises its soft limit of open files to the hard one, as training scripts do",
    "env_at_import": "imports a module the fork server preloaded that read a variable its target's env= sets",
    "mp_output_diverges": "as mp_output, but the output says how many steps this process trained (a resume "
                          "delivers another model.json)",
}
#: Modes of a program that reports nothing: its target declares where its checkpoints appear.
ZERO_CHANGE = ("zc_plain", "zc_fork_exit")


def newest(out: str) -> str | None:
    paths = glob.glob(os.path.join(out, "step_*.json"))
    return max(paths, key=lambda p: int(os.path.basename(p)[5:-5])) if paths else None


def save(out: str, step: int) -> str:
    path = os.path.join(out, f"step_{step}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(path + ".tmp", path)
    return path


def fork_child(ending: str) -> None:
    """Fork a child that ends as ``ending`` says; the parent waits for it, as a launcher would."""
    pid = os.fork()
    if pid == 0:
        if ending == "raise":
            raise RuntimeError("the child's own error")
        sys.exit(0)
    os.waitpid(pid, 0)


def write_output(out: str, value: int, go) -> None:
    """In a multiprocessing child: once the program's main has returned (``go`` set), deliver model.json. The
    pause makes a parent that does not wait for it (as a fresh interpreter does at exit) finish first."""
    import time

    go.wait()
    time.sleep(0.5)
    with open(os.path.join(out, "model.json.tmp"), "w") as f:
        json.dump({"value": value}, f)
    os.replace(os.path.join(out, "model.json.tmp"), os.path.join(out, "model.json"))


def deliver_late(out: str, value: int) -> None:
    """Start a child that is no daemon to write model.json, and let it go as main returns."""
    import multiprocessing

    go = multiprocessing.Event()
    multiprocessing.Process(target=write_output, args=(out, value, go)).start()
    go.set()


def deliver_from_thread(out: str, value: int) -> None:
    """Start a thread that is no daemon to write model.json, and let it go as main returns."""
    import threading

    go = threading.Event()
    threading.Thread(target=write_output, args=(out, value, go)).start()
    go.set()


#: The signals ignored where the session was started, by name, comma separated: a process inherits them
#: ignored through ``exec``, and Python then leaves SIGINT ignored too (a background job of a shell script has
#: SIGINT and SIGQUIT ignored).
IGNORED_ENV = "FRESH_EQUIVALENCE_IGNORED"


def check_signals() -> None:
    """The handlers a fresh interpreter starts with (Python's for SIGINT, SIGPIPE ignored, the rest the
    default; each ignored that :data:`IGNORED_ENV` names), then one of the program's own, which must run."""
    import signal

    expected = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
                signal.SIGTERM: signal.SIG_DFL, signal.SIGUSR1: signal.SIG_DFL, signal.SIGCHLD: signal.SIG_DFL}
    ignored = set(filter(None, os.environ.get(IGNORED_ENV, "").split(",")))
    expected = {s: signal.SIG_IGN if s.name in ignored else handler for s, handler in expected.items()}
    found = {s: signal.getsignal(s) for s in expected}
    if found != expected:
        raise SystemExit(f"signal handlers {found}")
    seen = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    os.kill(os.getpid(), signal.SIGUSR1)
    if seen != [signal.SIGUSR1]:
        raise SystemExit("the program's own SIGUSR1 handler did not run")


def check_warnings() -> None:
    """A DeprecationWarning of ``__main__`` is shown by the default filters, one of a library's is not."""
    import warnings

    with warnings.catch_warnings(record=True) as shown:
        warnings.warn("of the program", DeprecationWarning, stacklevel=1)
        warnings.warn_explicit("of a library", DeprecationWarning, "somelib.py", 1, module="somelib")
    if [str(w.message) for w in shown] != ["of the program"]:
        raise SystemExit(f"warnings shown: {[str(w.message) for w in shown]}")


def main(mode: str, out: str) -> None:
    if mode == "exec_wrapper":
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "plain", out])
    if mode == "argv" and (sys.argv[1:] != [mode, out] or sys.argv[0] != os.path.basename(__file__)
                           or not os.path.isabs(__file__)):
        raise SystemExit(f"unexpected sys.argv {sys.argv}")
    if mode == "env_at_import":
        import reads_setting_at_import

        if reads_setting_at_import.SETTING != "on":
            raise SystemExit(f"imported with {reads_setting_at_import.NAME}={reads_setting_at_import.SETTING}")
    if mode == "signals":
        check_signals()
    if mode == "warnings":
        check_warnings()
    if mode == "faulthandler":
        import faulthandler

        faulthandler.enable()
        faulthandler.dump_traceback()
    if mode == "rlimit":
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if mode in ("fork_early", "zc_fork_exit"):
        fork_child("exit")
    if mode == "atexit_raises":
        atexit.register(lambda: 1 / 0)
    source = newest(out)
    start = 0
    if source:
        with open(source) as f:
            start = json.load(f)["step"]
    if mode in ZERO_CHANGE:  # a checkpoint every step: each is one of the harness's steps
        for step in range(start + 1, STEPS + 1):
            save(out, step)
        return
    run = client.connect()
    run.resumed(start, source)
    if mode == "exit_on_resume" and start:
        os._exit(0)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        run.step_end(step)
        if run.should_checkpoint(step) or step % 2 == 0:
            run.checkpoint_published(step, save(out, step))
        if mode in ("fork_exit", "fork_raise") and step == 1:
            fork_child("raise" if mode == "fork_raise" else "exit")
        if mode == "exit_mid" and step == 1:
            os._exit(0)
        if mode == "exit_code" and step == 2:
            os._exit(5)
    if mode == "chdir_file":
        os.chdir("/")
        with open(os.path.join(os.path.dirname(__file__), "fresh_equivalence_program.py")) as f:
            f.read()
    if mode == "stdout_closed":
        print("closing stdout")
        sys.stdout.close()
    if mode == "exit_after_last":
        os._exit(0)
    if mode == "mp_joined":
        import multiprocessing

        go = multiprocessing.Event()
        go.set()
        child = multiprocessing.Process(target=write_output, args=(out, STEPS, go))
        child.start()
        child.join()
    if mode == "thread_output":
        deliver_from_thread(out, STEPS)
    if mode == "mp_output":
        deliver_late(out, STEPS)
    if mode == "mp_output_diverges":
        deliver_late(out, STEPS - start)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
