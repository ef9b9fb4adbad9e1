"""Programs that misbehave as command targets (run as ``python command_programs.py MODE CHECKPOINT_DIR``):
each speaks the line protocol by hand, with the stdlib only, to show one thing the harness must catch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def call(sock: socket.socket, reader, line: str) -> dict:
    sock.sendall(line.encode() + b"\n")
    return json.loads(reader.readline())


def main(mode: str, out: str) -> None:
    if mode == "silent":  # trains without reporting anything
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
