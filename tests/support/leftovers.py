"""What a session leaves behind: each session under test runs with a canary in its environment, which every
process it starts inherits, so a scan of ``/proc`` finds what is left of it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def interruptible() -> None:
    """A background job inherits SIGINT ignored (a CI script run with ``&``); Python then installs no
    KeyboardInterrupt handler. The session under test must see Ctrl-C as a terminal delivers it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def marked(canary: str) -> list[int]:
    """Live processes (not zombies) whose environment carries the canary."""
    needle = f"LEFTOVER_CANARY={canary}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{name}/environ").read_bytes():
                state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
                if state != b"Z":
                    found.append(int(name))
        except OSError:
            continue
    return found


def settle(canary: str, seconds: float = 20.0) -> list[int]:
    """What is left once the kernel has delivered the last kills (polled, not a speed assertion: 5 s was
    once too short on a loaded 2-core CI machine)."""
    deadline = time.monotonic() + seconds
    while (left := marked(canary)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
