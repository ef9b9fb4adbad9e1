"""A program that reports what its interpreter gave it (run as a command target, through the client): its
arguments, ``__name__``, ``__file__``, working folder, ``sys.path[0]``, an environment variable (in facts.json in
its checkpoint folder), and whether an exit function it registers and a thread it starts (not a daemon) finish;
then it exits with the code its first
argument names."""

import atexit
import json
import os
import sys
import threading

from pytest_resume_check import client


def main() -> None:
    run = client.connect()
    run.resumed(0)
    facts = {"argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "name": __name__,
             "file": os.path.basename(__file__), "cwd": os.getcwd(), "path0": sys.path[0],
             "env": os.environ.get("FACTS_VALUE"), "connected": run.active}
    run.step_end(1)
    with open(os.path.join(run.checkpoint_dir, "facts.json"), "w") as f:
        json.dump(facts, f)
    marker = os.path.join(run.checkpoint_dir, "exit_functions_ran")
    atexit.register(lambda: open(marker, "w").close())
    # A thread (no daemon) that writes its file only once the interpreter ends: the threading module's exit
    # hooks (what concurrent.futures uses to finish an executor's queue) run before such threads are joined.
    done = threading.Event()
    late = os.path.join(run.checkpoint_dir, "thread_finished")
    threading.Thread(target=lambda: done.wait() and open(late, "w").close()).start()
    threading._register_atexit(done.set)
    code = int(sys.argv[1])
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
