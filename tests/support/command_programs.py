"""Programs that misbehave as command targets (run as ``python command_programs.py MODE CHECKPOINT_DIR``):
each speaks the line protocol by hand, with the stdlib only, to show one thing the harness must catch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

#: ``long_log``: how long its first step logs, line after line (longer than the test's hang limit).
LONG_LOG = 5.0


def call(sock: socket.socket, reader, line: str) -> dict:
    sock.sendall(line.encode() + b"\n")
    return json.loads(reader.readline())


def main(mode: str, out: str) -> None:
    if mode == "silent":  # trains without reporting anything
        return
    if mode == "mute":  # trains for a long time without reporting anything
        time.sleep(120)
        return
    if mode == "fails":
        print("loading data from /nowhere")
        sys.exit(3)
    sock = socket.socket(fileno=int(os.environ["RESUME_CHECK_FD"]))
    reader = sock.makefile("rb")
    if mode == "garbled":
        answer = call(sock, reader, "step 1 done")
        print("answer:", answer)
        return
    if mode in ("deep", "huge_number", "kill_ready", "watched"):  # lines that are no call a program may make
        line = {"deep": "[" * 200_000, "huge_number": '{"call": "step_end", "step": 1e400}',
                "kill_ready": json.dumps({"call": "kill_ready", "text": "here", "extra": {}}),
                "watched": json.dumps({"call": "watched", "kind": "commit", "path": out, "extra": {}})}[mode]
        print("answer:", call(sock, reader, line))
        return
    if mode == "long_line":  # one line longer than the harness reads, then a call it must answer in turn
        print("answer:", call(sock, reader, "x" * (17 << 20)))
        print("answer:", call(sock, reader, json.dumps({"call": "log", "text": "after"})))
        return
    if mode == "helper":  # a forked helper inherits the socket and outlives the program
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    if mode == "long_log":  # one step that logs as fast as it can for LONG_LOG seconds
        call(sock, reader, json.dumps({"call": "resumed", "step": 0}))
        call(sock, reader, json.dumps({"call": "consumed", "step": 1, "epoch": 0, "ids": [1]}))
        until = time.monotonic() + LONG_LOG
        while time.monotonic() < until:
            call(sock, reader, json.dumps({"call": "log", "text": "still working"}))
        call(sock, reader, json.dumps({"call": "step_end", "step": 1}))
        return
    if mode == "helper":
        for step in (0, 1, 2):
            calls = [{"call": "resumed", "step": 0}] if step == 0 else [
                {"call": "consumed", "step": step, "epoch": 0, "ids": [step]}, {"call": "step_end", "step": step}]
            for c in calls:
                call(sock, reader, json.dumps(c))
        return
    if mode == "escapes":  # leaves a process of its own session behind, then is killed at step 1
        sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
        with open(os.path.join(out, "..", "sleeper.pid"), "w") as f:
            f.write(str(sleeper.pid))
        call(sock, reader, json.dumps({"call": "resumed", "step": 0}))
        for step in (1, 2):
            call(sock, reader, json.dumps({"call": "consumed", "step": step, "epoch": 0, "ids": [step]}))
            call(sock, reader, json.dumps({"call": "step_end", "step": step}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
