"""How a hung run's report reads the stacks its processes wrote into its log, from log files
written here: which processes and threads it quotes, how many frames, where the run's own output ends.
No processes."""

from __future__ import annotations

import os
import sysconfig

import pytest

import pytest_resume_check
from pytest_resume_check.records.events import stacks_header
from pytest_resume_check.report import text as rp

STDLIB = sysconfig.get_paths()["stdlib"]
LIBRARY = os.path.join(sysconfig.get_paths()["purelib"], "torch", "distributed", "distributed_c10d.py")
HARNESS = os.path.dirname(pytest_resume_check.__file__)
MINE = "/home/me/project/my_trainer.py"


def frame(file, line, function):
    return f'  File "{file}", line {line} in {function}'


#: The main thread deep in a library under the trainer's call, a helper thread of the harness (stdlib and
#: harness frames only) and a thread of the trainer's own.
RANK1 = [
    "Thread 0x00007f0000000001 (most recent call first):",
    frame(f"{STDLIB}/threading.py", 327, "wait"),
    frame(f"{HARNESS}/child/main.py", 114, "_write_loop"),
    frame(f"{STDLIB}/threading.py", 982, "run"),
    "",
    "Thread 0x00007f0000000002 (most recent call first):",
    frame(f"{STDLIB}/queue.py", 171, "get"),
    frame(MINE, 20, "prefetch_forever"),
    frame(f"{STDLIB}/threading.py", 982, "run"),
    "",
    "Current thread 0x00007f0000000003 (most recent call first):",
    *(frame(LIBRARY, 100 + i, f"c10d_{i}") for i in range(6)),
    frame(MINE, 41, "all_reduce_grads"),
    frame(MINE, 60, "train"),
    frame(f"{HARNESS}/child/main.py", 196, "_run_target"),
]


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "run1.log"
    path.write_text("\n".join(["step 1 done", "step 2 done", "", stacks_header(0, 101),
                               "Current thread 0x00007f0000000009 (most recent call first):",
                               frame(f"{HARNESS}/run.py", 345, "_await_kill"), frame(MINE, 50, "train"),
                               "", stacks_header(1, 102), *RANK1, "", stacks_header(2, 103), ""]) + "\n")
    return path


def test_the_header_the_harness_writes_is_the_one_the_report_reads():
    for rank, pid in ((None, 7), (0, 8), (12, 9)):
        match = rp.STACKS_HEADER_PATTERN.match(stacks_header(rank, pid))
        assert match and match["rank"] == (None if rank is None else str(rank)) and match["pid"] == str(pid)


def test_the_stacks_are_read_per_process_with_the_main_thread_last(log):
    processes = rp.stacks(log)
    assert [(p["rank"], p["pid"], len(p["threads"])) for p in processes] == [(0, 101, 1), (1, 102, 3), (2, 103, 0)]
    main = processes[1]["threads"][-1]
    assert main["main"] and main["thread"] == "0x00007f0000000003"
    assert main["frames"][6] == {"file": MINE, "line": 41, "function": "all_reduce_grads"}
    assert [t["main"] for t in processes[1]["threads"]] == [False, False, True]
    assert [len(t["frames"]) for t in rp.stacks(log, frames=4)[1]["threads"]] == [3, 3, 4]


def test_the_report_quotes_each_main_thread_and_the_trainers_threads_with_their_innermost_frames(log):
    lines = rp.stack_lines(rp.stacks(log))
    assert lines == [
        "rank 0 (pid 101), main thread:",
        "  " + frame(f"{HARNESS}/run.py", 345, "_await_kill").strip(),
        "  " + frame(MINE, 50, "train").strip(),
        "rank 1 (pid 102), main thread:",
        *("  " + frame(LIBRARY, 100 + i, f"c10d_{i}").strip() for i in range(rp.STACK_FRAMES)),
        "  ...",  # the trainer's innermost call, deeper than the five innermost
        "  " + frame(MINE, 41, "all_reduce_grads").strip(),
        "rank 1 (pid 102), thread 0x00007f0000000002:",  # the trainer's own thread; the harness's is left out
        "  " + frame(f"{STDLIB}/queue.py", 171, "get").strip(),
        "  " + frame(MINE, 20, "prefetch_forever").strip(),
        "  " + frame(f"{STDLIB}/threading.py", 982, "run").strip(),
        f"rank 2 (pid 103): {rp.NO_STACKS}",
    ]


def test_a_hung_runs_output_ends_where_its_stacks_begin(log):
    assert rp.log_tail(log, 5, hung=True) == ["step 1 done", "step 2 done"]
    assert rp.log_tail(log, 1) == [stacks_header(2, 103)]  # read as output when the run is not a hung one


def test_which_frames_are_the_trainers():
    assert rp.is_trainer_frame(MINE)
    assert rp.is_trainer_frame(os.path.join(HARNESS, "builtin", "loop.py"))  # a bundled target is a trainer
    assert not rp.is_trainer_frame(os.path.join(HARNESS, "run.py"))
    assert not rp.is_trainer_frame(LIBRARY)
    assert not rp.is_trainer_frame(f"{STDLIB}/threading.py")
    assert not rp.is_trainer_frame("<frozen importlib._bootstrap>")
