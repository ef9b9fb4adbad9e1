"""A torch-free trainer configured by its environment, for the tests of which variables a run read
(:mod:`pytest_resume_check.child.environ`): one variable read when this module is imported (in the fork
server, which preloads it), others in each run through each way Python code reads one, from a thread
too, and reads that do not count: the machine's, the harness's, one a service of the target sets, and
those the standard library makes (``ssl`` reads ``SSL_CERT_FILE``)."""

import os
import ssl
import threading
from contextlib import contextmanager

#: The variables this trainer's own code reads that count, sorted.
COUNTED = ["RC_TEST_AT_IMPORT", "RC_TEST_CONTAINS", "RC_TEST_GETENV", "RC_TEST_ITEM", "RC_TEST_THREAD"]
#: What the service gives every run.
SERVICE_ENV = "RC_TEST_SERVICE"
STEPS = 4

LEVEL = os.environ.get("RC_TEST_AT_IMPORT", "0")


@contextmanager
def service():
    yield {SERVICE_ENV: "db:1"}


def train(run):
    os.getenv("RC_TEST_GETENV")
    _ = "RC_TEST_CONTAINS" in os.environ
    os.environ.get("HOME")  # the machine's
    os.environ.get("PYTEST_RESUME_CHECK_RUN")  # the harness's
    os.environ.get(SERVICE_ENV)  # the service's, which the harness sets for the run
    ssl.get_default_verify_paths()  # the standard library's reads
    reader = threading.Thread(target=lambda: os.environ.get("RC_TEST_THREAD"))
    reader.start()
    reader.join()
    start = 0
    latest = run.checkpoint_dir / "latest"
    if run.resume_mode == "auto" and latest.exists():
        start = int(latest.read_text())
    run.resumed(start, run.checkpoint_dir if start else None)
    for step in range(start + 1, STEPS + 1):
        run.consumed([step], step=step, epoch=0)
        if step == 2:
            try:
                os.environ["RC_TEST_ITEM"]
            except KeyError:
                pass
        run.step_end(step)
        if run.should_checkpoint(step):
            latest.write_text(str(step))
            run.checkpoint_published(step, run.checkpoint_dir)
