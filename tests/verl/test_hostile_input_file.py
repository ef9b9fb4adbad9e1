"""Hostile ``agentlightning_input.pt`` files: crafted by someone who knows the format and recomputes the
checksum. A pickle that would run code is refused as unsafe, naming what it calls and never advising to
load it with pickled code enabled; a small file claiming huge sizes is refused as corrupt before anything
of that size is allocated (measured in a child process, under an address-space limit).
"""

import collections
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from agentlightning.verl import errors, input_bounds, input_file  # noqa: E402
from agentlightning.verl import input_format as fmt  # noqa: E402
from agentlightning.verl import verl_layout as layout  # noqa: E402
from agentlightning.verl.value_encoding import NDARRAY_TAG  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GB = 1 << 30
#: A crafted file must not make loading grow the peak RSS by more than this (the claims are ~2 GB).
MAX_GROWTH_KB = 100 * 1024


def payload(**stream_extra):
    """A well-formed payload; ``stream_extra`` adds entries to the input stream state."""
    return {
        fmt.KEY_FORMAT_VERSION: fmt.INPUT_STATE_FORMAT_VERSION,
        fmt.KEY_GLOBAL_STEP: 1,
        fmt.KEY_INPUT_STREAM: {
            "loader_state": {},
            "buffered_tail": None,
            "input_epoch": 0,
            "loader_batches_taken_in_epoch": 0,
            **stream_extra,
        },
        fmt.KEY_CARRIED_OVER: {"rows": [], "input_ids": [], "input_epochs": [], "submitted_steps": []},
    }


def place(folder, data):
    """Write ``data`` as the input file of ``folder``; returns the folder as str."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / layout.INPUT_STATE_FILENAME).write_bytes(data)
    return str(folder)


def read_error(folder):
    with pytest.raises(errors.InputCheckpointError) as info:
        input_file.read_input_checkpoint(folder)
    return info.value


# ---------------------------------------------------------------- crafting


class RunsShell:
    """Unpickling this runs ``command`` with os.system."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Storage:
    """A storage reference: pickled as the persistent id ``("storage", cls, key, "cpu", count)``."""

    def __init__(self, cls, key, count):
        self.cls, self.key, self.count = cls, key, count


class Tensor:
    """A tensor as torch.save pickles it, with whatever size and stride it is given."""

    def __init__(self, storage, size, stride):
        self.storage, self.size, self.stride = storage, size, stride

    def __reduce__(self):
        args = (self.storage, 0, self.size, self.stride, False, collections.OrderedDict())
        return (torch._utils._rebuild_tensor_v2, args)


class Calls:
    """Unpickling this calls ``function(*args)``."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return (self.function, self.args)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.count)
        return None


def crafted(value, records=None, protocol=2, patch=None):
    """A checksummed input file whose pickle is ``value`` (with ``Storage`` references to ``records``),
    packed like torch's archive; ``patch(bytearray)`` edits the archive before its checksum is added."""
    pickled = io.BytesIO()
    _Pickler(pickled, protocol=protocol).dump(value)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickled.getvalue())
        z.writestr("archive/byteorder", "little")
        for key, data in (records or {}).items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    data = bytearray(archive.getvalue())
    if patch:
        patch(data)
    sealed = input_file.checksummed(bytes(data))
    assert sealed is not None
    return sealed


def central_entry(data, name):
    """The offset of the zip central-directory entry for ``name`` in ``data``."""
    position = data.find(b"PK\x01\x02")
    while position >= 0:
        size = struct.unpack_from("<H", data, position + 28)[0]
        if bytes(data[position + 46:position + 46 + size]) == name.encode():
            return position
        position = data.find(b"PK\x01\x02", position + 4)
    raise AssertionError(f"no entry {name}")


def claims_compressed(name, size):
    """A patch: the directory says record ``name`` is deflated to ``size`` bytes."""

    def patch(data):
        entry = central_entry(data, name)
        struct.pack_into("<H", data, entry + 10, 8)  # compression method: deflate
        struct.pack_into("<I", data, entry + 24, size)  # uncompressed size

    return patch


def claims_stored(name, size):
    """A patch: the directory says stored record ``name`` has ``size`` bytes."""

    def patch(data):
        entry = central_entry(data, name)
        struct.pack_into("<II", data, entry + 20, size, size)  # compressed and uncompressed size

    return patch


def repeated_list(depth, width=10):
    """A list that memo references repeat ``width ** depth`` times, in a few hundred pickle bytes."""
    node = [1] * width
    for _ in range(depth):
        node = [node] * width
    return node


def numpy_record(dtype, data, shape):
    return {NDARRAY_TAG: 1, "dtype": dtype, "shape": shape, "scalar": False, "data": data}


#: name -> (file, the error class, a fragment of its message). Each claims about 2 GB or more.
HOSTILE = {
    "a storage claiming 2 GB in a 4-byte record": (
        lambda: crafted(payload(x=Tensor(Storage(torch.FloatStorage, "0", GB // 2), (1,), (1,))), {"0": b"\0" * 4}),
        errors.InputCheckpointCorruptError,
        "a storage of 2147483648 bytes in data/0, but its record holds 4",
    ),
    "a tensor whose shape spans 2 GB of a 4-byte storage, in a numpy record": (
        lambda: crafted(
            payload(x=numpy_record("<f4", Tensor(Storage(torch.FloatStorage, "0", 1), (GB // 2,), (0,)), [1])),
            {"0": b"\0" * 4},
        ),
        errors.InputCheckpointCorruptError,
        "its tensors and numpy arrays would take more than",
    ),
    "a plain tensor whose shape spans 2 GB of a 4-byte storage": (
        lambda: crafted(payload(x=Tensor(Storage(torch.FloatStorage, "0", 1), (GB // 2,), (0,))), {"0": b"\0" * 4}),
        errors.InputCheckpointCorruptError,
        "its tensors and numpy arrays would take more than",
    ),
    "a numpy string array 500M characters wide": (
        lambda: crafted(payload(x=numpy_record("<U500000000", ["a"], [1]))),
        errors.InputCheckpointCorruptError,
        "its tensors and numpy arrays would take more than",
    ),
    "a list repeated 10**9 times through memo references": (
        lambda: crafted(payload(x=repeated_list(8))),
        errors.InputCheckpointCorruptError,
        "its lists and dicts repeat into more than",
    ),
    "a zip record claiming 2 GB deflated": (
        lambda: crafted(payload(), patch=claims_compressed("archive/byteorder", 2 * GB)),
        errors.InputCheckpointCorruptError,
        "has a compressed record 'archive/byteorder'",
    ),
    "a zip record claiming 2 GB stored": (
        lambda: crafted(payload(), patch=claims_stored("archive/data.pkl", 2 * GB)),
        errors.InputCheckpointCorruptError,
        "past the end of its",
    ),
    "a bytearray of 2 GB": (
        lambda: crafted(payload(x=Calls(bytearray, 2 * GB))),
        errors.InputCheckpointUnsafeError,
        "bytearray",
    ),
}

#: Runs in a child: loads each folder, reporting the error and the peak RSS growth of the load, under
#: an address-space limit of 1.5 GB above the child's own (a regression fails instead of swapping).
CHILD = r"""
import json, resource, sys
from agentlightning.verl import input_file
try:
    with open("/proc/self/status") as status:
        vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = vm_kb * 1024 + 3 * (1 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
except (OSError, StopIteration, ValueError):
    pass  # no /proc: the RSS growth is still measured
report = {}
for name, folder in json.loads(sys.argv[1]).items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        input_file.read_input_checkpoint(folder)
        error, message = None, ""
    except BaseException as err:
        error, message = type(err).__name__, str(err)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report[name] = {"error": error, "message": message, "growth_kb": after - before}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def hostile_loads(tmp_path_factory):
    """Every HOSTILE file loaded in one child process: name -> error, message and RSS growth (kB)."""
    base = tmp_path_factory.mktemp("hostile")
    folders = {}
    for i, (name, (build, _, _)) in enumerate(HOSTILE.items()):
        data = build()
        assert len(data) < 4096, f"{name}: {len(data)} bytes"
        folders[name] = place(base / f"global_step_{i}", data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(folders)], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- pickled code


def test_a_pickled_os_system_call_with_a_valid_checksum_is_unsafe_names_the_call_and_never_runs(tmp_path):
    pwned = tmp_path / "pwned"
    data = input_file.encode_input_file(payload(x=RunsShell(f"touch {pwned}")))  # packed as the writer does
    err = read_error(place(tmp_path / "global_step_1", data))
    assert type(err) is errors.InputCheckpointUnsafeError
    assert f"{os.system.__module__}.system" in str(err)  # posix.system: the refused global
    assert "weights_only" not in str(err)  # neither torch's advice nor any other
    assert not pwned.exists()


def test_a_pickle_naming_its_global_through_the_stack_is_unsafe_too(tmp_path):
    pwned = tmp_path / "pwned"
    data = crafted(payload(x=RunsShell(f"touch {pwned}")), protocol=4)  # STACK_GLOBAL, not GLOBAL
    err = read_error(place(tmp_path / "global_step_1", data))
    assert type(err) is errors.InputCheckpointUnsafeError
    assert f"{os.system.__module__}.system" in str(err)
    assert not pwned.exists()


def test_torchs_own_refusal_is_reported_as_unsafe_without_its_advice(tmp_path):
    """The pickle check comes first; torch.load(weights_only=True) behind it is reported the same way."""
    pwned = tmp_path / "pwned"
    data = input_file.encode_input_file(payload(x=RunsShell(f"touch {pwned}")))
    with pytest.raises(errors.InputCheckpointUnsafeError) as info:
        input_file._unpickle(str(tmp_path / layout.INPUT_STATE_FILENAME), data)
    assert f"{os.system.__module__}.system" in str(info.value)
    assert "weights_only" not in str(info.value)
    assert not pwned.exists()


def test_other_refusals_by_torch_keep_only_what_was_wrong_and_are_printable(tmp_path):
    def nul_byteorder(data):
        at = data.find(b"little")
        data[at:at + 6] = b"\0" * 6

    for i, (data, problem) in enumerate([
        (crafted(payload(x={1, 2}), protocol=4), "Unsupported operand"),  # opcodes torch's unpickler lacks
        (crafted(payload(), patch=nul_byteorder), "Unknown endianness type: ??????"),
    ]):
        err = read_error(place(tmp_path / f"global_step_{i}", data))
        assert type(err) is errors.InputCheckpointCorruptError
        assert problem in str(err)
        assert "weights_only" not in str(err) and str(err).isprintable()


# ---------------------------------------------------------------- claimed sizes


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_small_file_claiming_a_huge_size_is_refused_with_bounded_memory(hostile_loads, name):
    _, error, fragment = HOSTILE[name]
    result = hostile_loads[name]
    assert result["error"] == error.__name__, result["message"]
    assert fragment in result["message"]
    assert "weights_only" not in result["message"]
    assert result["growth_kb"] < MAX_GROWTH_KB, f"peak RSS grew by {result['growth_kb']} kB"


def test_a_zip64_end_record_away_from_where_python_reads_it_is_refused(tmp_path):
    data = bytearray(input_file.encode_input_file(payload()))
    end = len(data) - input_file.CHECKSUM_SIZE - input_bounds.ZIP_END_SIZE
    locator = end - input_bounds.ZIP64_LOCATOR_SIZE
    assert data[locator:locator + 4] == input_bounds.ZIP64_LOCATOR  # torch writes one
    struct.pack_into("<Q", data, locator + 8, 0)  # its offset now points at the first record
    sealed = input_file.checksummed(bytes(data[:-input_file.CHECKSUM_SIZE - 2]) + b"\0\0")
    err = read_error(place(tmp_path / "global_step_1", sealed))
    assert type(err) is errors.InputCheckpointCorruptError
    assert "zip64" in str(err)


# ---------------------------------------------------------------- what the writer writes is read back


def test_tensors_of_every_dtype_views_and_padded_string_arrays_are_written_and_read_back(tmp_path):
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
              torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint16, torch.uint32, torch.uint64]
    loader_state = {str(dtype): torch.ones(3, dtype=dtype) for dtype in dtypes}
    loader_state["view"] = torch.arange(10)[2:5]
    loader_state["prompts"] = np.array(["a" * 500] + ["b"] * 100)  # one long string pads all 101
    loader_state["padded"] = np.array(["a", "b"], dtype="<U256")
    state = {"loader_state": loader_state, "buffered_tail": None, "input_epoch": 0,
             "loader_batches_taken_in_epoch": 0}
    input_file.write_input_state(str(tmp_path), 2, state)
    read = input_file.read_input_state(str(tmp_path), expected_step=2)["loader_state"]
    for key, value in loader_state.items():
        if isinstance(value, torch.Tensor):
            assert read[key].dtype == value.dtype and torch.equal(read[key], value)
        else:
            assert read[key].dtype == value.dtype and np.array_equal(read[key], value)


@pytest.mark.parametrize(
    "value, fragment",
    [
        (torch.nn.Parameter(torch.ones(2)), "torch._utils._rebuild_parameter"),
        (torch.zeros(1).expand(GB // 4), "would take more than"),
    ],
    ids=["a parameter", "an expanded view of 1 GB"],
)
def test_a_value_the_reader_would_refuse_is_refused_at_save_and_no_file_is_written(tmp_path, value, fragment):
    state = {"loader_state": {"x": value}, "buffered_tail": None, "input_epoch": 0,
             "loader_batches_taken_in_epoch": 0}
    with pytest.raises(errors.InputCheckpointEncodeError) as info:
        input_file.write_input_state(str(tmp_path), 1, state)
    assert fragment in str(info.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_anything_but_a_regular_file_is_refused_before_it_is_read(tmp_path, kind):
    """A FIFO blocked the read forever and a link to /dev/zero grew memory without end."""
    path = Path(layout.input_state_path(str(tmp_path)))
    {"fifo": lambda: os.mkfifo(path), "dev_zero": lambda: path.symlink_to("/dev/zero"),
     "folder": lambda: path.mkdir()}[kind]()
    what = {"fifo": "is a FIFO", "dev_zero": "is a character device", "folder": "is a folder"}[kind]
    with pytest.raises(errors.InputCheckpointCorruptError, match=f"{what}, not a regular file"):
        input_file.read_input_checkpoint(str(tmp_path))


def test_a_file_larger_than_an_input_file_can_be_is_refused_by_its_size(tmp_path):
    path = Path(layout.input_state_path(str(tmp_path)))
    with open(path, "wb") as f:  # sparse: 3 GiB claimed, nothing written
        f.truncate(3 * GB)
    with pytest.raises(errors.InputCheckpointCorruptError, match=r"is 3\.0 GiB, more than the 1\.0 GiB"):
        input_file.read_input_checkpoint(str(tmp_path))


def test_no_error_quotes_the_bytes_of_the_file(tmp_path):
    secret = tmp_path / "private.txt"
    secret.write_bytes(b"hunter2-password-of-somebody")
    Path(layout.input_state_path(str(tmp_path))).symlink_to(secret)
    with pytest.raises(errors.InputCheckpointCorruptError) as info:
        input_file.read_input_checkpoint(str(tmp_path))
    assert "hunter2" not in str(info.value) and "is not a torch zip archive" in str(info.value)
    from agentlightning.verl import resume_selection

    Path(layout.tracker_path(str(tmp_path))).symlink_to(secret)
    step, problem = resume_selection.read_tracker(str(tmp_path))
    assert step is None and "hunter2" not in problem and "not a step number" in problem
