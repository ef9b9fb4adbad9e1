"""Crash safety of the Agent Lightning trainer's checkpoints, in-process and fast.

The file operations of one save are recorded in order with the harness's own recorder
(:class:`pytest_resume_check.child.recorder.Recorder`, the one the crash matrix installs in its child
processes). A kill before each of them is simulated by stopping the run there and copying the
checkpoint directory as it stands at that moment (what a SIGKILL leaves), a power loss by also cutting
every file back to what was fsynced, and an I/O error by raising ``OSError`` instead of the operation
(once, or for it and every later one). Each outcome is then resumed and compared with the uninterrupted
run. Damaged trackers and folders exercise the ``auto`` fallback. The same kills as real processes are
the crash matrix of pytest-resume-check; corrupt input files are in test_corruption_corpus.py.
"""

import errno
import os
import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from omegaconf import open_dict  # noqa: E402

from agentlightning.verl import errors  # noqa: E402
from agentlightning.verl import resume_selection as rs  # noqa: E402
from agentlightning.verl import verl_layout as layout  # noqa: E402
from agentlightning.verl.cpu_builder import build_cpu_trainer  # noqa: E402
from agentlightning.verl.schedule import mixed_latency  # noqa: E402
from agentlightning.verl.stock_trainer import StockCpuRayPPOTrainer  # noqa: E402
from agentlightning.verl.testing import RecordingObserver, SimulatedKill  # noqa: E402
from pytest_resume_check.child.recorder import Recorder  # noqa: E402
from pytest_resume_check.records.faults import (  # noqa: E402
    INJECTED,
    MODE_ERROR,
    MODE_POWER,
    MODE_RECORD,
    FaultPlan,
    apply_after_kill,
)

OPTIONS = {"latency_profile": mixed_latency}  # groups are in flight at both checkpoints
TRACKER = layout.TRACKER_FILENAME
G2, G4 = "global_step_2", "global_step_4"
INPUT4 = f"{G4}/{layout.INPUT_STATE_FILENAME}"

#: Every file operation of the async save of step 4, relative to the checkpoint directory.
ASYNC_SAVE_OPS = [
    ("mkdir", G4),
    ("open", f"{INPUT4}.tmp"),
    ("write", f"{INPUT4}.tmp"),
    ("fsync", f"{INPUT4}.tmp"),
    ("close", f"{INPUT4}.tmp"),
    ("replace", f"{INPUT4}.tmp", INPUT4),
    ("fsync", G4),
    ("mkdir", f"{G4}/actor"),
    ("open", f"{G4}/actor/model.pt.tmp"),
    ("write", f"{G4}/actor/model.pt.tmp"),
    ("fsync", f"{G4}/actor/model.pt.tmp"),
    ("close", f"{G4}/actor/model.pt.tmp"),
    ("replace", f"{G4}/actor/model.pt.tmp", f"{G4}/actor/model.pt"),
    ("fsync", f"{G4}/actor"),
    ("torch.save", f"{G4}/data.pt"),
    ("fsync", f"{G4}/data.pt"),
    ("fsync", G4),
    ("open", f"{TRACKER}.tmp"),
    ("write", f"{TRACKER}.tmp"),
    ("fsync", f"{TRACKER}.tmp"),
    ("close", f"{TRACKER}.tmp"),
    ("replace", f"{TRACKER}.tmp", TRACKER),
    ("fsync", "."),
]
TRACKER_REPLACE = ASYNC_SAVE_OPS.index(("replace", f"{TRACKER}.tmp", TRACKER))


# ---------------------------------------------------------------- runs


def run(out, observer=None, **options):
    trainer = build_cpu_trainer(str(out), **{**OPTIONS, **options})
    trainer.input_observer = observer if observer is not None else RecordingObserver()
    try:
        trainer.fit()
    except SimulatedKill:
        pass
    return trainer


def saved(out, **options):
    """Saves at steps 2 and 4, killed at the end of step 5."""
    return run(out, RecordingObserver(checkpoint_steps={2, 4}, kill_at_step_end=5), **options).input_observer


def resume(out, **options):
    """Resume from ``out``; returns the trainer and the fallback warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run(out, **options)
    return trainer, [w.message for w in caught if issubclass(w.category, rs.CheckpointFallbackWarning)]


def continues(first, second, reference):
    """The first run up to the checkpoint the second resumed from, then the second: the reference?"""
    restored = second.input_observer.resumed_step
    return all(
        first.ledger(kind, up_to_step=restored) + second.input_observer.ledger(kind) == reference.ledger(kind)
        for kind in ("consumed", "trained")
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("reference")).input_observer


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("sync-reference"), async_enabled=False).input_observer


# ---------------------------------------------------------------- recording file operations


@dataclass
class WatchingObserver(RecordingObserver):
    """A :class:`RecordingObserver` that opens the recorder's window when a save is decided and closes it
    when the save is published, as the harness's ``RunContext`` does in a child process."""

    recorder: Recorder | None = None

    def should_checkpoint(self, step):
        wanted = super().should_checkpoint(step)
        if wanted:
            self.recorder.start(step)
        return wanted

    def checkpoint_published(self, step, path):
        self.recorder.finish(step)  # a kill planned after the last op happens here, before the report
        super().checkpoint_published(step, path)


def _not_killed(text, extra):
    raise AssertionError(f"a recording without a kill planned was killed: {text}")


RECORD_ONLY = FaultPlan(4, MODE_RECORD)


def record_save(out, plan=RECORD_ONLY, on_kill=_not_killed, **options):
    """A run saving at 2 and 4 (killed at the end of step 5) whose save of step 4 is recorded, with
    ``plan`` applied to it; returns the recorder and the run's observer."""
    os.makedirs(out, exist_ok=True)
    trainer = build_cpu_trainer(str(out), **{**OPTIONS, **options})
    with Recorder(plan, str(out), lambda op: None, on_kill) as recorder:
        trainer.input_observer = WatchingObserver(checkpoint_steps={2, 4}, kill_at_step_end=5, recorder=recorder)
        try:
            trainer.fit()
        except SimulatedKill:
            pass
    return recorder, trainer.input_observer


def op_tuples(recorder):
    """The recorded ops as ``(kind, path)`` or ``(kind, path, target)``, paths relative to the directory."""
    return [(op.kind, op.path) if op.target is None else (op.kind, op.path, op.target) for op in recorder.ops]


# ---------------------------------------------------------------- the save


def test_an_async_save_performs_these_file_operations_in_order(tmp_path):
    recorder, _ = record_save(tmp_path / "out")
    assert op_tuples(recorder) == ASYNC_SAVE_OPS


def test_a_sync_save_writes_verls_files_and_publishes_the_tracker_last_and_atomically(tmp_path):
    recorder, _ = record_save(tmp_path / "out", async_enabled=False)
    assert op_tuples(recorder) == [("mkdir", G4)] + ASYNC_SAVE_OPS[7:]
    assert (tmp_path / "out" / TRACKER).read_bytes() == b"4"


def test_every_file_of_a_save_is_fsynced_before_the_tracker_names_it(tmp_path):
    recorder, _ = record_save(tmp_path / "out")
    assert recorder.written and all(recorder.synced[path] == size for path, size in recorder.written.items())
    fsynced_before_publishing = {op.path for op in recorder.ops[:TRACKER_REPLACE] if op.kind == "fsync"}
    assert {f"{G4}/data.pt", G4, f"{G4}/actor", f"{TRACKER}.tmp"} <= fsynced_before_publishing


@pytest.fixture(scope="module")
def crash_outcomes(tmp_path_factory):
    """For each kill point of the save of step 4 (before each op, and after the last): the directory the
    kill leaves, the directory a power loss at that moment leaves, and the killed run's observer."""
    base = tmp_path_factory.mktemp("crash")
    outcomes = []
    for index in range(len(ASYNC_SAVE_OPS) + 1):
        out, kill, power = base / f"out-{index}", base / f"kill-{index}", base / f"power-{index}"

        def on_kill(text, extra, out=out, kill=kill, power=power):
            # Copied at once: the exception below runs the save's clean-up code, which a SIGKILL would not
            # (its file operations are stopped by the recorder too, but nothing else should run first).
            if not kill.exists():
                shutil.copytree(out, kill)
                shutil.copytree(out, power)
                apply_after_kill(str(power), extra)  # every file cut back to its fsynced bytes
            raise SimulatedKill(text)

        _, first = record_save(out, FaultPlan(4, MODE_POWER, index), on_kill)
        if kill.exists():
            outcomes.append((index, kill, power, first))
    return outcomes


@pytest.mark.parametrize("kind", ["kill", "power loss"])
def test_a_crash_before_any_operation_of_a_save_resumes_from_the_previous_or_the_new_checkpoint(
    crash_outcomes, reference, kind
):
    assert [index for index, _, _, _ in crash_outcomes] == list(range(len(ASYNC_SAVE_OPS) + 1))
    resumed = {}
    for index, kill, power, first in crash_outcomes:
        second, fallbacks = resume(kill if kind == "kill" else power)
        assert fallbacks == [], (index, fallbacks)  # the tracker is never torn: no fallback needed
        assert continues(first, second, reference), index
        resumed[index] = second.input_observer.resumed_step
    assert resumed == {i: 2 if i <= TRACKER_REPLACE else 4 for i in resumed}


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
def test_an_io_error_at_any_operation_fails_the_save_and_leaves_the_previous_checkpoint_selected(
    tmp_path, reference, persistent
):
    for index in range(len(ASYNC_SAVE_OPS)):
        out = tmp_path / f"{index}"
        with pytest.raises(OSError, match=re.escape(INJECTED)):
            record_save(out, FaultPlan(4, MODE_ERROR, index, errno.ENOSPC, persistent))
        # Only when the disk refuses everything after the tracker was replaced (its folder's fsync) can the
        # tracker not be put back; it then names step 4, which is complete.
        expected = 4 if persistent and index > TRACKER_REPLACE else 2
        assert (out / TRACKER).read_bytes() == str(expected).encode(), index
        if not persistent:  # the clean-up could run: nothing of step 4 looks complete
            assert not (out / INPUT4).exists() and not (out / G4 / "data.pt").exists(), index
            assert not any(name.endswith(".tmp") for _, _, names in os.walk(out) for name in names), index
        first = RecordingObserver()  # the failed run's events up to its save equal the reference's
        first.events = [e for e in reference.events if e[1] <= 4]
        second, fallbacks = resume(out)
        assert second.input_observer.resumed_step == expected and fallbacks == [], index
        assert continues(first, second, reference), index


def test_a_save_with_verls_async_save_setting_writes_no_tracker_like_verl(tmp_path):
    trainer = build_cpu_trainer(str(tmp_path), **OPTIONS)
    with open_dict(trainer.config):
        trainer.config.actor_rollout_ref.actor.checkpoint.async_save = True
    trainer.input_observer = RecordingObserver(checkpoint_steps={2}, kill_at_step_end=3)
    with pytest.raises(SimulatedKill):
        trainer.fit()
    assert (tmp_path / G2 / layout.INPUT_STATE_FILENAME).exists() and not (tmp_path / TRACKER).exists()


# ---------------------------------------------------------------- auto fallback


TRACKER_DAMAGE = {
    "missing": (None, "is missing"),
    "empty": (b"", "is empty"),
    "garbage": (b"4x\n", "not a step number"),
    "binary": (b"\xff\xfe\x00", "not a step number"),
    "naming a missing folder": (b"9", "names global_step_9, which does not exist"),
}


@pytest.mark.parametrize("damage", list(TRACKER_DAMAGE))
def test_a_damaged_tracker_falls_back_to_the_newest_complete_folder_with_a_warning(tmp_path, reference, damage):
    content, reason = TRACKER_DAMAGE[damage]
    first = saved(tmp_path)
    if content is None:
        os.remove(tmp_path / TRACKER)
    else:
        (tmp_path / TRACKER).write_bytes(content)
    second, [warning] = resume(tmp_path)
    assert type(warning) is rs.CheckpointFallbackWarning
    assert warning.chosen == str(tmp_path / G4) and second.input_observer.resumed_step == 4
    assert f"uses {tmp_path / G4}" in str(warning) and reason in str(warning) and TRACKER in str(warning)
    assert continues(first, second, reference)


def _flip_first_member_byte(path):
    with zipfile.ZipFile(path) as archive:
        info = archive.infolist()[0]
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        f.seek(info.header_offset + 30 + name_len + extra_len)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _cut_in_half(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _only_temporary(path):
    os.replace(path, f"{path}.tmp")


FOLDER_DAMAGE = {
    "no data.pt": (lambda g: os.remove(g / "data.pt"), "has no data.pt"),
    "data.pt cut short": (lambda g: _cut_in_half(g / "data.pt"), "has data.pt cut short or damaged"),
    "data.pt failing its CRC": (lambda g: _flip_first_member_byte(g / "data.pt"), "data.pt damaged (CRC mismatch"),
    "only a temporary actor file": (lambda g: _only_temporary(g / "actor" / "model.pt"), "has no actor checkpoint"),
    "no actor folder": (lambda g: shutil.rmtree(g / "actor"), "has no actor checkpoint"),
    "only a temporary input file": (
        lambda g: _only_temporary(g / layout.INPUT_STATE_FILENAME),
        "has no agentlightning_input.pt (only its temporary file",
    ),
    "input file cut short": (
        lambda g: _cut_in_half(g / layout.INPUT_STATE_FILENAME),
        "has agentlightning_input.pt cut short",
    ),
}


@pytest.mark.parametrize("damage", list(FOLDER_DAMAGE))
def test_a_tracker_naming_an_incomplete_folder_falls_back_to_the_previous_complete_one(tmp_path, reference, damage):
    spoil, reason = FOLDER_DAMAGE[damage]
    first = saved(tmp_path)
    spoil(tmp_path / G4)
    second, [warning] = resume(tmp_path)
    assert warning.chosen == str(tmp_path / G2) and second.input_observer.resumed_step == 2
    assert [s.path for s in warning.skipped] == [str(tmp_path / G4)]
    assert reason in str(warning), str(warning)
    assert continues(first, second, reference)


def test_without_any_complete_folder_auto_starts_fresh_with_a_warning_naming_what_it_skipped(tmp_path, reference):
    saved(tmp_path)
    for folder in (G2, G4):
        os.remove(tmp_path / folder / "data.pt")
    (tmp_path / TRACKER).write_bytes(b"")
    second, [warning] = resume(tmp_path)
    assert type(warning) is rs.NoCompleteCheckpointWarning and warning.chosen is None
    assert [s.path for s in warning.skipped] == [str(tmp_path / p) for p in (TRACKER, G4, G2)]
    assert "starts fresh from step 0" in str(warning) and "has no data.pt" in str(warning)
    assert second.input_observer.resumed_step == 0
    assert second.input_observer.ledger("consumed") == reference.ledger("consumed")


def test_an_empty_checkpoint_directory_starts_fresh_without_a_warning(tmp_path):
    second, fallbacks = resume(tmp_path / "never-written")
    assert second.input_observer.resumed_step == 0 and fallbacks == []


def test_a_folder_newer_than_the_tracker_is_not_used_while_the_tracker_is_intact(tmp_path):
    saved(tmp_path)
    (tmp_path / TRACKER).write_bytes(b"2")  # step 4 complete, but killed before its tracker replace
    second, fallbacks = resume(tmp_path)
    assert second.input_observer.resumed_step == 2 and fallbacks == []


def test_sync_mode_falls_back_the_same_way(tmp_path, sync_reference):
    first = saved(tmp_path, async_enabled=False)
    (tmp_path / TRACKER).write_bytes(b"")
    second, [warning] = resume(tmp_path, async_enabled=False)
    assert warning.chosen == str(tmp_path / G4) and not (tmp_path / INPUT4).exists()
    assert continues(first, second, sync_reference)


def test_a_corrupt_published_input_file_stops_auto_resume_with_a_typed_error(tmp_path):
    saved(tmp_path)
    raw = bytearray((tmp_path / INPUT4).read_bytes())
    raw[len(raw) // 2] ^= 0x04  # a full-length file: no crash leaves this
    (tmp_path / INPUT4).write_bytes(bytes(raw))
    trainer = build_cpu_trainer(str(tmp_path), **OPTIONS)
    trainer.input_observer = RecordingObserver()
    with pytest.raises(errors.InputCheckpointCorruptError, match="fails its SHA-256 checksum") as info:
        trainer.fit()
    assert info.value.path == str(tmp_path / INPUT4)
    assert trainer.actor_rollout_wg.updates == 0 and trainer.input_observer.events == []


# ---------------------------------------------------------------- resume_path: no fallback


def test_an_explicit_incomplete_folder_is_an_error_naming_it_and_what_it_lacks(tmp_path):
    saved(tmp_path)
    os.remove(tmp_path / G4 / "data.pt")
    trainer = build_cpu_trainer(str(tmp_path / "new"), resume_mode="resume_path", resume_from_path=str(tmp_path / G4))
    trainer.input_observer = RecordingObserver()
    with pytest.raises(errors.CheckpointIncompleteError, match="is incomplete: it has no data.pt") as info:
        trainer.fit()
    assert info.value.path == str(tmp_path / G4) and "resume_from_path" in info.value.fix
    assert trainer.actor_rollout_wg.updates == 0


def test_an_explicit_folder_with_an_input_file_cut_short_is_an_error_not_a_fallback(tmp_path):
    saved(tmp_path)
    _cut_in_half(tmp_path / INPUT4)
    trainer = build_cpu_trainer(str(tmp_path), resume_mode="resume_path", resume_from_path=str(tmp_path / G4))
    trainer.input_observer = RecordingObserver()
    with pytest.raises(errors.InputCheckpointTruncatedError, match="cut short"):
        trainer.fit()


def test_an_explicit_folder_that_does_not_exist_is_an_error(tmp_path):
    trainer = build_cpu_trainer(str(tmp_path), resume_mode="resume_path", resume_from_path=str(tmp_path / G4))
    trainer.input_observer = RecordingObserver()
    with pytest.raises(errors.CheckpointIncompleteError, match="does not exist"):
        trainer.fit()


# ---------------------------------------------------------------- findings about stock verl


STOCK = {"async_enabled": False, "trainer_cls": StockCpuRayPPOTrainer}


def test_stock_verl_cannot_resume_from_an_empty_tracker(tmp_path):
    # Finding: verl writes the tracker with a plain open("w"); a kill during that write leaves it empty
    # and RayPPOTrainer._load_checkpoint fails on int("") in find_latest_ckpt_path, which it calls
    # before it looks at trainer.resume_from_path.
    run(tmp_path, RecordingObserver(checkpoint_steps={2}, kill_after_checkpoint=2), **STOCK)
    (tmp_path / TRACKER).write_text("")
    with pytest.raises(ValueError, match="invalid literal for int"):
        run(tmp_path, **STOCK)
    with pytest.raises(ValueError, match="invalid literal for int"):  # even when given the folder
        run(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / G2), **STOCK)


def test_stock_verl_silently_starts_from_scratch_when_the_tracker_names_a_missing_folder(tmp_path):
    # Finding: find_latest_ckpt_path returns None for a missing folder, and auto resume then trains from
    # step 0 with only a print, although global_step_2 is complete.
    run(tmp_path, RecordingObserver(checkpoint_steps={2}, kill_after_checkpoint=2), **STOCK)
    (tmp_path / TRACKER).write_text("9")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run(tmp_path, **STOCK)
    assert trainer.input_observer.resumed_step == 0
    assert not [w for w in caught if "global_step" in str(w.message)]
