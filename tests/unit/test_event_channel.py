"""The supervisor reads a run's event channel in bulk: one read takes every message written so far, and the
messages are handed out one at a time, so what the handlers see is what reading one message at a time gave
(same events, same order); a message cut at the end of a read waits in the buffer for the next."""

from __future__ import annotations

import os
import struct

import pytest

from pytest_resume_check.process import supervisor
from pytest_resume_check.records import events as ev

MESSAGES = [
    [ev.Event(ev.RESUMED, step=0)],
    [ev.Event(ev.CONSUMED, step=1, epoch=0, ids=(1, 2)), ev.Event(ev.STEP_END, step=1)],
    [ev.Event(ev.CONSUMED, step=2, epoch=0, ids=((3, "a"),), text="x" * 20_000)],  # longer than a small chunk
    [ev.Event(ev.STEP_END, step=2, extra={"pid": 7}), ev.Event(ev.DONE)],
]


def frame(events: list[ev.Event], long: bool = False) -> bytes:
    """A message as multiprocessing's Connection.send_bytes frames it (the -1 form for long ones)."""
    raw = b"\n".join(e.to_wire() for e in events)
    return (struct.pack("!i", -1) + struct.pack("!Q", len(raw)) if long else struct.pack("!i", len(raw))) + raw


@pytest.fixture
def pipe():
    read, write = os.pipe()
    os.set_blocking(write, False)
    yield read, write
    for fd in (read, write):
        try:
            os.close(fd)
        except OSError:
            pass


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


@pytest.mark.parametrize("chunk", [1, 5, 4096, supervisor.CHUNK])
def test_messages_read_in_chunks_of_any_size_are_the_same_events_in_the_same_order(pipe, chunk):
    read, write = pipe
    channel = supervisor._Channel(read, chunk=chunk)
    got = []
    for i, message in enumerate(MESSAGES):
        write_all(write, frame(message, long=i == 2))
        got.append(channel.receive(5))
    assert got == MESSAGES


def test_one_read_takes_every_message_written_and_hands_them_out_one_at_a_time(pipe, monkeypatch):
    read, write = pipe
    write_all(write, b"".join(frame(m) for m in MESSAGES[:2]) + frame(MESSAGES[3]))
    reads = []
    real = os.read
    monkeypatch.setattr(supervisor.os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    channel = supervisor._Channel(read)
    assert channel.receive(5) == MESSAGES[0]
    assert channel.queued
    assert channel.receive(5) == MESSAGES[1]
    assert channel.receive(5) == MESSAGES[3]
    assert len(reads) == 1 and not channel.queued


def test_a_message_cut_at_the_end_of_a_read_is_kept_for_the_next(pipe):
    read, write = pipe
    whole = frame(MESSAGES[0]) + frame(MESSAGES[1])
    cut = len(frame(MESSAGES[0])) + 6
    write_all(write, whole[:cut])
    channel = supervisor._Channel(read)
    assert channel.receive(5) == MESSAGES[0]
    assert not channel.queued
    write_all(write, whole[cut:])
    assert channel.receive(5) == MESSAGES[1]


def test_a_message_that_never_arrives_in_full_is_no_event_naming_its_length(pipe):
    read, write = pipe
    write_all(write, frame(MESSAGES[1])[:10])
    with pytest.raises(supervisor._BadFrame, match=f"a message of {len(frame(MESSAGES[1])) - 4} bytes that did not"):
        supervisor._Channel(read).receive(0.05)


def test_the_messages_before_a_made_up_length_are_events_and_the_length_is_no_event(pipe):
    read, write = pipe
    write_all(write, frame(MESSAGES[0]) + struct.pack("!i", -5) + b"junk")
    channel = supervisor._Channel(read)
    assert channel.receive(5) == MESSAGES[0]
    with pytest.raises(supervisor._BadFrame, match="a message length of -5 bytes"):
        channel.receive(5)


def test_a_closed_channel_ends_the_reading_after_its_last_whole_message(pipe):
    read, write = pipe
    write_all(write, frame(MESSAGES[0]) + frame(MESSAGES[1])[:7])
    os.close(write)
    channel = supervisor._Channel(read)
    assert channel.receive(5) == MESSAGES[0]
    with pytest.raises(EOFError):
        channel.receive(5)
