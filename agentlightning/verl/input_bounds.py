"""Bounds and safety of an input file's bytes, checked before torch reads them.

torch allocates what a file claims before it reads it, and unpickling runs what a pickle names. So an
input file's zip directory, the opcodes of its pickle (read, never run) and, after a safe unpickle, the
payload's sizes are checked against the bytes that back them: a file of N bytes is read with memory
in proportion to N, and a pickle naming any global other than those ``torch.save`` writes for plain
tensors is refused. :mod:`agentlightning.verl.input_file` turns a :class:`Refused` into its typed errors
(and runs the same checks on what it writes).
"""

from __future__ import annotations

import io
import pickletools
import struct
import warnings
import zipfile
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch

from agentlightning.verl.value_encoding import NDARRAY_TAG

# Zip layout: every archive starts with a local file header and ends with the end-of-central-directory
# record (22 bytes, then a comment of the length its last two bytes give). torch also writes a zip64
# end record (56 bytes) and its locator (20 bytes) just before it.
ZIP_START = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
ZIP_END_SIZE = 22
ZIP_LOCAL_HEADER_SIZE = 30
ZIP64_END_SIZE = 56
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_LOCATOR_SIZE = 20

#: Decoded tensors and numpy arrays may take at most this many times the file's size (and at least
#: DECODED_FLOOR bytes): numpy pads every string of an array to the longest one, so a string array can
#: legitimately take more memory than its file, but never without bound.
DECODED_FACTOR = 64
DECODED_FLOOR = 1 << 20


def _storage_item_sizes() -> dict[str, int]:
    """The storage classes ``torch.save`` names in a pickle, by global name, with their item sizes."""
    sizes = {"torch.storage.UntypedStorage": 1, "torch.UntypedStorage": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading a legacy storage class's dtype warns that it is legacy
        for name, value in vars(torch).items():
            is_typed = isinstance(value, type) and issubclass(value, torch.storage.TypedStorage)
            if is_typed and name.endswith("Storage") and value is not torch.storage.TypedStorage:
                sizes[f"torch.{name}"] = value.dtype.itemsize
    return sizes


_STORAGE_ITEM_SIZES = _storage_item_sizes()
#: The globals an input file's pickle may name: what ``torch.save`` writes for a plain dense tensor (its
#: rebuild function, storage class, dtype, and the OrderedDict of its backward hooks). Anything else is
#: code that loading would run.
_ALLOWED_GLOBALS = frozenset(
    {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3"}
    | set(_STORAGE_ITEM_SIZES)
    | {f"torch.{name}" for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
)


class Refused(Exception):
    """Bytes or a payload a legitimate input file cannot be: ``problem`` says why; ``code`` names the
    global the pickle would call when that is why."""

    def __init__(self, problem: str, code: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.code = code


def zip_end(raw: bytes) -> int | None:
    """Where the end record of the zip archive ``raw`` starts, or None when none ends exactly at its end
    (with its comment)."""
    lowest = max(0, len(raw) - ZIP_END_SIZE - 0xFFFF)
    position = raw.rfind(ZIP_END, lowest)
    while position >= 0:
        comment_size = int.from_bytes(raw[position + 20:position + 22], "little")
        if position + ZIP_END_SIZE + comment_size == len(raw):
            return position
        position = raw.rfind(ZIP_END, lowest, position)
    return None


def check_archive(raw: bytes) -> None:
    """Check the zip archive ``raw`` and its pickle before torch reads them; raises :class:`Refused`.

    torch allocates what a file claims before it reads it: a record of the size the zip directory gives
    (compressed records may claim any size), and a storage of the item count the pickle's persistent id
    gives. So every record must be stored uncompressed and lie inside the file, and every storage the
    pickle asks for must be exactly as large as its record (``data/<key>``). The pickle is read with
    :func:`pickletools.genops`, which parses opcodes without running them, tracking only the literals,
    tuples and memo entries needed to see the globals it names (checked against ``_ALLOWED_GLOBALS``)
    and its storage references. Python's zip reader and torch's (miniz) find the same directory: the end
    record ends the file (see ``input_file._check_bytes``) and a zip64 end record must be where both look.
    """
    end = zip_end(raw)
    if end is None:
        raise Refused("has no end-of-archive record at its end")
    locator = raw[max(0, end - ZIP64_LOCATOR_SIZE):end]
    if locator.startswith(ZIP64_LOCATOR):
        if int.from_bytes(locator[8:16], "little") != end - ZIP64_LOCATOR_SIZE - ZIP64_END_SIZE:
            raise Refused("has a zip64 end record away from its end (a crafted zip directory)")
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            sizes = _record_sizes(raw, archive.infolist())
            folder = archive.infolist()[0].filename.partition("/")[0]
            pickled = archive.read(f"{folder}/data.pkl")
    except Refused:
        raise
    except Exception as err:  # zipfile fails in many ways on crafted directories
        raise Refused(f"is not a readable torch zip archive ({type(err).__name__}: {str(err)[:200]})") from None
    try:
        _scan_pickle(pickled, sizes)
    except Refused:
        raise
    except Exception as err:  # malformed opcodes, stack underflow, a missing memo entry
        raise Refused(f"cannot be unpickled ({type(err).__name__}: {str(err)[:200]})") from None


def _record_sizes(raw: bytes, infos: list[zipfile.ZipInfo]) -> dict[str, int]:
    """The size of every record of the archive (named without its folder), each checked to be stored
    uncompressed inside the file; one folder, no name twice (torch looks names up ignoring case)."""
    sizes: dict[str, int] = {}
    folders, lowered = set(), set()
    for info in infos:
        folder, _, name = info.filename.partition("/")
        folders.add(folder)
        start = info.header_offset
        header = raw[start:start + ZIP_LOCAL_HEADER_SIZE]
        if len(header) < ZIP_LOCAL_HEADER_SIZE or not header.startswith(ZIP_START):
            raise Refused(f"has a zip directory entry for {info.filename!r} that points at no record")
        name_size, extra_size = struct.unpack("<HH", header[26:30])
        data_end = start + ZIP_LOCAL_HEADER_SIZE + name_size + extra_size + info.file_size
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise Refused(f"has a compressed record {info.filename!r} (torch.save stores records as they are)")
        if data_end > len(raw):
            raise Refused(
                f"claims more data than it holds: its zip directory gives {info.file_size} bytes for "
                f"{info.filename!r}, past the end of its {len(raw)} bytes"
            )
        if name.lower() in lowered:
            raise Refused(f"has two records named {info.filename!r}")
        lowered.add(name.lower())
        sizes[name] = info.file_size
    if len(folders) != 1 or "data.pkl" not in sizes:
        raise Refused("is not a torch archive (its records are not one folder holding data.pkl)")
    return sizes


class _Global(str):
    """A global named by the pickle (module.name), as the simulated stack holds it."""


def _stack_effects() -> dict[str, tuple[bool, int, int]]:
    """For every pickle opcode: whether it takes everything above the last MARK (and the MARK), how
    many items it takes from below that, and how many it pushes (-1: it pushes a MARK)."""
    mark = pickletools.markobject
    effects = {}
    for op in pickletools.opcodes:
        takes_mark = mark in op.stack_before
        below = op.stack_before.index(mark) if takes_mark else len(op.stack_before)
        effects[op.name] = (takes_mark, below, -1 if op.stack_after == [mark] else len(op.stack_after))
    return effects


_STACK_EFFECTS = _stack_effects()
_OTHER = object()  # a value the scan does not track
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}  # MEMOIZE: at the next index
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_TUPLES = {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"}
_GLOBALS = {"GLOBAL", "INST", "STACK_GLOBAL"}
_NEVER_WRITTEN = {"PERSID", "EXT1", "EXT2", "EXT4"}  # a text storage id; globals by extension code


def _scan_pickle(pickled: bytes, sizes: Mapping[str, int]) -> None:
    """Refuse a pickle that names a global outside ``_ALLOWED_GLOBALS`` or asks for a storage its record
    does not back, without running it (see :func:`check_archive`).

    The stack is simulated as pickle keeps it: no opcode takes items from below the last open MARK.
    """
    stack: list[Any] = []
    marks: list[int] = []  # where each open MARK is on the stack
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(pickled):
        name = op.name
        takes_mark, below, pushes = _STACK_EFFECTS[name]
        if name in _NEVER_WRITTEN:
            if name == "PERSID":
                raise Refused("holds a text storage reference, which torch.save never writes")
            raise Refused("names a global by extension code", code=f"the global of extension code {arg}")
        above: list[Any] = []
        if takes_mark:
            start = marks.pop()
            above = stack[start:]
            del stack[start:]
        if name in _MEMO_PUT:
            below = 1  # reads the top item without taking it
        if len(stack) - below < (marks[-1] if marks else 0):
            raise Refused("cannot be unpickled (its pickle takes from an empty stack)")
        if name in _MEMO_PUT:
            memo[len(memo) if arg is None else arg] = stack[-1]
            continue
        taken = stack[len(stack) - below:] + above if below else above
        del stack[len(stack) - below:]
        value: Any = _OTHER
        if name in _GLOBALS:
            # genops types every argument Any | None; GLOBAL's and INST's is the str "module name".
            parts = taken if name == "STACK_GLOBAL" else cast(str, arg).split(" ", 1)
            if not all(type(part) is str for part in parts):
                raise Refused("names a global it computes", code="a global whose name it computes")
            value = _Global(".".join(parts))
            if value not in _ALLOWED_GLOBALS:
                raise Refused(f"names {value}", code=str(value))
        elif name == "BINPERSID":
            _check_storage(taken[0], sizes)
        elif name in _MEMO_GET:
            value = memo[cast(int, arg)]  # a GET's argument is the memo index, an int
        elif name in _TUPLES:
            value = tuple(taken)
        elif name == "DUP":
            value = taken[0]
        elif not below and not takes_mark and arg is not None:
            value = arg  # a literal: int, float, str, bytes
        if pushes < 0:
            marks.append(len(stack))
        elif pushes:
            stack.extend([value] * pushes)


def _check_storage(pid: Any, sizes: Mapping[str, int]) -> None:
    """Refuse a persistent id that is not ``("storage", <storage class>, key, location, count)`` with
    count items filling exactly the record ``data/<key>``."""
    if not (
        isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and type(pid[1]) is _Global
        and type(pid[2]) is str and type(pid[4]) is int and pid[1] in _STORAGE_ITEM_SIZES
    ):
        raise Refused("holds a storage reference of a form torch.save never writes")
    record = f"data/{pid[2]}"
    claimed = pid[4] * _STORAGE_ITEM_SIZES[pid[1]]
    if record not in sizes or claimed != sizes[record]:
        held = f"its record holds {sizes[record]}" if record in sizes else "it has no such record"
        raise Refused(f"claims more data than it holds: a storage of {claimed} bytes in {record}, but {held}")


def check_state(payload: Any, file_size: int) -> None:
    """Refuse an unpickled payload whose decoding would take memory out of proportion to its file.

    Walks the payload the way :func:`~agentlightning.verl.value_encoding.decode_value` does, shared
    references followed each time, and stops as soon as either bound is passed:

    - values: at most ``file_size`` (every value of a written payload costs at least one pickle byte; a
      pickle that repeats one list through memo references would make decoding rebuild it each time);
    - bytes of tensors (their elements, which an expanded view can claim beyond its storage) and of the
      numpy arrays decoding builds: at most ``DECODED_FACTOR`` times ``file_size`` (``DECODED_FLOOR`` at
      least).
    """
    byte_limit = max(DECODED_FACTOR * file_size, DECODED_FLOOR)
    todo = [payload]
    values = 1
    decoded = 0
    while todo:
        value = todo.pop()
        children: Any = ()
        if isinstance(value, torch.Tensor):
            decoded += value.numel() * value.element_size()
        elif isinstance(value, dict):
            decoded += _array_bytes(value) if NDARRAY_TAG in value else 0
            children = list(value.values())
        elif isinstance(value, (list, tuple)):
            children = value
        values += len(children)
        if values > file_size:
            raise Refused(
                f"claims more data than it holds: its lists and dicts repeat into more than {file_size} "
                "values, more than its bytes spell out"
            )
        if decoded > byte_limit:
            raise Refused(
                f"claims more data than it holds: its tensors and numpy arrays would take more than the "
                f"{byte_limit} bytes a file of {file_size} bytes may hold ({DECODED_FACTOR} times its size, "
                f"{DECODED_FLOOR} at least)"
            )
        todo.extend(children)


def _array_bytes(record: dict[str, Any]) -> int:
    """The bytes decoding the numpy ``record`` allocates; refuses records encode_value never writes."""
    text, data = record.get("dtype"), record.get("data")
    if type(record[NDARRAY_TAG]) is not int or record[NDARRAY_TAG] != 1 or type(text) is not str:
        raise Refused("holds a malformed numpy record (its tag or dtype)")
    try:
        dtype = np.dtype(text)
    except Exception as err:  # numpy refuses unknown dtype strings in several ways
        raise Refused(f"holds a malformed numpy record (dtype {text[:40]!r}: {type(err).__name__})") from None
    if dtype.kind in "biufc" and isinstance(data, torch.Tensor):
        return data.numel() * dtype.itemsize
    if dtype.kind == "O" and isinstance(data, list):
        return len(data) * dtype.itemsize
    item_type, char_size = {"U": (str, 4), "S": (bytes, 1)}.get(dtype.kind, (None, 0))
    if item_type and isinstance(data, list) and all(type(item) is item_type for item in data):
        longest = max((len(item) for item in data), default=0)
        return len(data) * max(dtype.itemsize, char_size * longest)
    raise Refused(f"holds a malformed numpy record (dtype {dtype.str} with data of type {type(data).__name__})")
