"""A corpus of corrupt ``agentlightning_input.pt`` files: every one is refused with a typed error that
names the file, none makes a resume start silently from scratch, and none runs code.

The files are generated from a real input file (step 4 of an async run with groups in flight):
truncations, bit flips, every entry missing in turn, wrong types, a step from another folder, unknown
format versions, a checksum stripped, and pickles whose ``__reduce__`` would create a marker file.
Under ``auto`` a file cut short is what an interrupted write leaves, so the resume falls back to the
previous complete folder with a warning; every other corrupt file stops the resume with its error
(agentlightning.verl.resume_selection states the rule). Under ``resume_path`` every one is an error.
"""

import io
import pickle
import shutil
import traceback
import warnings
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from agentlightning.verl import errors, input_file  # noqa: E402
from agentlightning.verl import input_format as fmt  # noqa: E402
from agentlightning.verl import resume_selection as rs  # noqa: E402
from agentlightning.verl import verl_layout as layout  # noqa: E402
from agentlightning.verl.cpu_builder import build_cpu_trainer  # noqa: E402
from agentlightning.verl.durable import torch_bytes  # noqa: E402
from agentlightning.verl.schedule import mixed_latency  # noqa: E402
from agentlightning.verl.testing import RecordingObserver, SimulatedKill  # noqa: E402

OPTIONS = {"latency_profile": mixed_latency}
STEP = 4


class CreatesMarker:
    """Unpickling this calls ``open(marker, "w")``: the file appears if any loader runs pickled code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@dataclass(frozen=True)
class Corrupt:
    name: str
    data: bytes
    error: type  # the exact class read_input_checkpoint raises
    problem: str  # a fragment of the message


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A checkpoint directory saved at steps 2 and 4 (the tracker names 4)."""
    out = tmp_path_factory.mktemp("source")
    trainer = build_cpu_trainer(str(out), **OPTIONS)
    trainer.input_observer = RecordingObserver(checkpoint_steps={2, STEP}, kill_at_step_end=STEP + 1)
    with pytest.raises(SimulatedKill):
        trainer.fit()
    return out


@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    return tmp_path_factory.mktemp("marker") / "code-was-run"


def _with(payload, path, value):
    """A deep-enough copy of ``payload`` with the entry at ``path`` (a tuple of keys) set, or removed
    when ``value`` is ``_DELETE``."""
    out = dict(payload)
    node = out
    for key in path[:-1]:
        node[key] = dict(node[key]) if isinstance(node[key], dict) else list(node[key])
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()


def build_corpus(valid: bytes, marker) -> list[Corrupt]:
    payload = torch.load(io.BytesIO(valid), weights_only=True)
    payload.pop(fmt.KEY_INTEGRITY)
    assert payload[fmt.KEY_CARRIED_OVER]["rows"], "the source file must hold carried-over groups"
    n = len(valid)
    corpus = []
    end = n - input_file.CHECKSUM_SIZE  # where the checksum comment starts; the zip end record is before it
    for offset in (0, 1, 3, 10, 64, 100, n // 4, n // 2, end - 22, end, n - 2, n - 1):
        truncated = errors.InputCheckpointTruncatedError
        corpus.append(Corrupt(f"truncated at {offset}", valid[:offset], truncated, "cut short"))
    for offset in (0, 3, 6, 16, 40, n // 3, n // 2, 2 * n // 3, end - 22, end - 2, end + 5, n - 1):
        flipped = bytearray(valid)
        flipped[offset] ^= 0x10
        problem = "not a torch zip archive" if offset < 4 else ""
        corpus.append(Corrupt(f"bit flip at {offset}", bytes(flipped), errors.InputCheckpointCorruptError, problem))

    def rewritten(name, changed, error, problem):
        corpus.append(Corrupt(name, input_file.encode_input_file(changed), error, problem))

    stream, groups = fmt.KEY_INPUT_STREAM, fmt.KEY_CARRIED_OVER
    for path in [(fmt.KEY_GLOBAL_STEP,), (stream,), (groups,)] + [(stream, k) for k in payload[stream]] + [
        (groups, k) for k in payload[groups]
    ]:
        rewritten(f"missing {'.'.join(path)}", _with(payload, path, _DELETE), errors.InputCheckpointCorruptError,
                  "lacks required entries")
    rewritten("missing format_version", _with(payload, (fmt.KEY_FORMAT_VERSION,), _DELETE),
              errors.InputCheckpointCorruptError, "no format version")
    wrong_types = {
        (fmt.KEY_FORMAT_VERSION,): "2",
        (fmt.KEY_GLOBAL_STEP,): "4",
        (fmt.KEY_INPUT_STREAM,): [1, 2],
        (stream, "loader_state"): None,
        (stream, "buffered_tail"): "abc",
        (stream, "input_epoch"): "1",
        (stream, "loader_batches_taken_in_epoch"): -1,
        (groups, "rows"): [5] * len(payload[groups]["rows"]),
        (groups, "input_ids"): ["a"] * len(payload[groups]["input_ids"]),
        (groups, "input_epochs"): [-1] * len(payload[groups]["input_epochs"]),
        (groups, "submitted_steps"): [99] * len(payload[groups]["submitted_steps"]),
        (groups, "input_ids", 0): True,
    }
    for path, value in wrong_types.items():
        error = errors.InputCheckpointCorruptError
        rewritten(f"wrong type of {'.'.join(map(str, path))}", _with(payload, path, value), error, "")
    rewritten("carried-over lists of different lengths", _with(payload, (groups, "input_ids"), []),
              errors.InputCheckpointCorruptError, "different lengths")
    rewritten("a malformed numpy record", _with(payload, (groups, "rows", 0, "prompt", "dtype"), "no-such-dtype"),
              errors.InputCheckpointCorruptError, "malformed numpy record")
    rewritten("a step from another folder", _with(payload, (fmt.KEY_GLOBAL_STEP,), 3),
              errors.InputCheckpointStepMismatchError, "records global step 3")
    for version in (99, 0):
        rewritten(f"format version {version}", _with(payload, (fmt.KEY_FORMAT_VERSION,), version),
                  errors.InputCheckpointVersionError, f"version {version}")
    corpus.append(Corrupt("checksum stripped", torch_bytes({**payload, fmt.KEY_INTEGRITY: "sha256"}),
                          errors.InputCheckpointCorruptError, "declares a checksum but has none"))
    corpus.append(Corrupt("not a dict", torch_bytes([payload]), errors.InputCheckpointCorruptError,
                          "no format version"))
    corpus.append(Corrupt("malicious pickle in a torch file", torch_bytes(_with(payload, (stream,), CreatesMarker(
        str(marker)))), errors.InputCheckpointUnsafeError, "pickled code"))
    rewritten("malicious pickle with a valid checksum", _with(payload, (groups, "rows", 0), CreatesMarker(str(marker))),
              errors.InputCheckpointUnsafeError, "calls io.open")
    corpus.append(Corrupt("malicious raw pickle", pickle.dumps(CreatesMarker(str(marker))),
                          errors.InputCheckpointCorruptError, "not a torch zip archive"))
    return corpus


@pytest.fixture(scope="module")
def corpus(source, marker):
    return build_corpus((source / f"global_step_{STEP}" / layout.INPUT_STATE_FILENAME).read_bytes(), marker)


def placed(source, tmp_path, data, **options):
    """A copy of ``source`` whose step-4 input file holds ``data``; returns the trainer to resume it."""
    out = tmp_path / "out"
    shutil.copytree(source, out)
    (out / f"global_step_{STEP}" / layout.INPUT_STATE_FILENAME).write_bytes(data)
    trainer = build_cpu_trainer(str(out), **{**OPTIONS, **options})
    trainer.input_observer = RecordingObserver()
    return trainer, out


def test_the_corpus_holds_more_than_20_distinct_corrupt_files(corpus):
    assert len(corpus) >= 20
    assert len({c.name for c in corpus}) == len({c.data for c in corpus}) == len(corpus)
    print(f"corruption corpus: {len(corpus)} files")


def test_every_corrupt_file_is_refused_with_its_typed_error_naming_the_file(tmp_path, corpus, marker):
    path = tmp_path / layout.INPUT_STATE_FILENAME
    for case in corpus:
        path.write_bytes(case.data)
        with pytest.raises(errors.InputCheckpointError) as info:
            input_file.read_input_checkpoint(str(tmp_path), expected_step=STEP)
        assert type(info.value) is case.error, (case.name, info.value)
        assert info.value.path == str(path) and str(path) in str(info.value), case.name
        assert case.problem in info.value.problem, (case.name, info.value.problem)
        shown = "".join(traceback.format_exception(info.value))
        assert "site-packages/torch" not in shown and "zipfile" not in shown, case.name  # no torch traceback
    assert not marker.exists()


def test_every_single_bit_flip_anywhere_in_the_file_is_caught(tmp_path, source):
    valid = (source / f"global_step_{STEP}" / layout.INPUT_STATE_FILENAME).read_bytes()
    path = tmp_path / layout.INPUT_STATE_FILENAME
    missed = []
    for offset in range(len(valid)):
        flipped = bytearray(valid)
        flipped[offset] ^= 1 << (offset % 8)
        path.write_bytes(bytes(flipped))
        try:
            input_file.read_input_checkpoint(str(tmp_path), expected_step=STEP)
            missed.append(offset)
        except errors.InputCheckpointTruncatedError:
            missed.append(offset)  # a full-length file must never pass for one cut short
        except errors.InputCheckpointCorruptError:
            pass
    assert missed == [], f"{len(missed)} of {len(valid)} flips not caught as corrupt: {missed[:20]}"


def test_under_auto_no_corrupt_file_makes_the_resume_start_from_scratch(tmp_path, source, corpus, marker):
    outcomes = {"typed error": 0, "fallback with a warning": 0, "silent restart": 0}
    for i, case in enumerate(corpus):
        trainer, out = placed(source, tmp_path / str(i), case.data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trainer.fit()
            except errors.InputCheckpointError as err:
                assert type(err) is case.error and case.error is not errors.InputCheckpointTruncatedError, case.name
                assert trainer.actor_rollout_wg.updates == 0 and trainer.input_observer.events == [], case.name
                outcomes["typed error"] += 1
                continue
        fallbacks = [w.message for w in caught if issubclass(w.category, rs.CheckpointFallbackWarning)]
        resumed = trainer.input_observer.resumed_path
        if resumed == str(out / "global_step_2") and len(fallbacks) == 1:
            assert case.error is errors.InputCheckpointTruncatedError, case.name  # only a cut-short file
            assert f"global_step_{STEP} is incomplete: it has agentlightning_input.pt cut short" in str(fallbacks[0])
            outcomes["fallback with a warning"] += 1
        else:
            outcomes["silent restart"] += 1
    print(f"auto resume over the corpus: {outcomes}")
    truncated = sum(c.error is errors.InputCheckpointTruncatedError for c in corpus)
    assert outcomes == {"typed error": len(corpus) - truncated, "fallback with a warning": truncated,
                        "silent restart": 0}
    assert not marker.exists()


def test_under_resume_path_every_corrupt_file_is_an_error(tmp_path, source, corpus, marker):
    for i, case in enumerate(corpus):
        out = tmp_path / str(i)
        trainer, out = placed(source, out, case.data, resume_mode="resume_path")
        trainer.config.trainer.resume_from_path = str(out / f"global_step_{STEP}")
        with pytest.raises(errors.InputCheckpointError) as info:
            trainer.fit()
        assert type(info.value) is case.error, case.name
        assert trainer.actor_rollout_wg.updates == 0, case.name
    assert not marker.exists()


def test_an_intact_file_from_the_corpus_source_resumes(tmp_path, source):
    valid = (source / f"global_step_{STEP}" / layout.INPUT_STATE_FILENAME).read_bytes()
    trainer, out = placed(source, tmp_path, valid)
    trainer.fit()
    assert trainer.input_observer.resumed_path == str(out / f"global_step_{STEP}")
