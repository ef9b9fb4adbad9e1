"""Which ``global_step_N`` folder a resume reads: the tracker, complete folders and the fallback rule.

verl publishes a checkpoint by writing ``latest_checkpointed_iteration.txt`` after the folder's files.
Stock verl writes it with a plain ``open("w")``, so a kill during that write leaves it empty and the
next resume fails on ``int("")``; a tracker naming a missing folder makes it start from scratch
without a word. :func:`choose_resume_folder` never does either.

A folder is **complete** when it holds the actor checkpoint (an ``actor/`` folder with a file that is
not a temporary ``*.tmp`` one; its weights are loaded once, by the worker group, never here), a
``data.pt`` that is a whole zip archive with intact CRCs, the critic checkpoint when a critic is used
and, in async mode, a valid ``agentlightning_input.pt`` (an input file present in sync mode must be
valid too). A folder the tracker (or ``resume_path``) names may lack the input file: it was published
by a writer that did not write one (a sync run, or a release before the input fix), and loads as such
-- unless the file's temporary ``.tmp`` is there, which means its write was cut off.

Rules by ``trainer.resume_mode``:

* ``disable``: no folder, nothing is read.
* ``resume_path``: ``trainer.resume_from_path``, which must be complete; anything else is an error
  (:class:`CheckpointIncompleteError`, or the input file's own :class:`InputCheckpointError`), never
  a fallback.
* ``auto``: the tracker's folder if it is complete. Otherwise (tracker missing, empty, garbage, naming
  a missing or incomplete folder) the newest complete ``global_step_N`` folder, with a
  :class:`CheckpointFallbackWarning` that names it and every candidate skipped and why. If none is
  complete, a fresh start with :class:`NoCompleteCheckpointWarning` listing what was found; with no
  tracker and no folder at all, a fresh start in silence.

**Corruption rule** (``auto``): damage a crash can leave makes a folder *incomplete* and is skipped
-- missing files, temporary files, a ``data.pt`` cut short or failing its CRC (verl writes it in
place), an input file cut short (:class:`InputCheckpointTruncatedError`). An input file that is
present at full length but fails its checks -- checksum, unsafe pickle, missing entries, wrong types,
wrong step, unknown format version -- stops the resume with its typed error, as in ``resume_path``:
the trainer fsyncs that file before it gets its name, so no kill and no power loss produces such a
file; its damage has another cause, and quietly re-training from an older checkpoint would hide it.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentlightning.verl.durable import TEMP_SUFFIX, NotReadable, read_regular, temp_path
from agentlightning.verl.errors import (
    CheckpointError,
    CheckpointIncompleteError,
    InputCheckpointTruncatedError,
)
from agentlightning.verl.input_file import read_input_checkpoint
from agentlightning.verl.input_format import InputCheckpoint
from agentlightning.verl.verl_layout import (
    DATALOADER_FILENAME,
    INPUT_STATE_FILENAME,
    STEP_FOLDER_PATTERN,
    actor_path,
    critic_path,
    data_state_path,
    input_state_path,
    names_a_step_folder,
    step_folder_name,
    step_folders,
    step_of_folder,
    tracker_path,
)

TRACKER_MISSING = "is missing"
FIX_EXPLICIT_FOLDER = (
    f"Set trainer.resume_from_path to a complete {STEP_FOLDER_PATTERN} folder, or use trainer.resume_mode=auto "
    "to take the newest complete one"
)


class CheckpointFallbackWarning(RuntimeWarning):
    """``auto`` resume did not use the tracker's folder; ``chosen`` is the folder it used instead and
    ``skipped`` lists each candidate passed over with the reason."""

    def __init__(self, message: str, chosen: str | None, skipped: Sequence[Skipped]) -> None:
        super().__init__(message)
        self.message = message
        self.chosen = chosen
        self.skipped = tuple(skipped)

    def __str__(self) -> str:
        return self.message


class NoCompleteCheckpointWarning(CheckpointFallbackWarning):
    """``auto`` resume found checkpoint files but no complete folder, and starts fresh (``chosen`` None)."""


@dataclass(frozen=True)
class Skipped:
    """A candidate ``auto`` resume passed over: the tracker or a folder, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


@dataclass(frozen=True)
class FolderCheck:
    """What :func:`check_folder` found: ``problem`` is None for a complete folder; ``checkpoint`` is its
    validated input file (None without one)."""

    folder: str
    problem: str | None
    checkpoint: InputCheckpoint | None
    error: CheckpointError | None = None

    @property
    def complete(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class ResumeChoice:
    """The folder a resume reads (None: start fresh), its input file, and what ``auto`` skipped."""

    folder: str | None
    checkpoint: InputCheckpoint | None
    skipped: tuple[Skipped, ...] = ()


#: A tracker holds one step number; a bigger file is no tracker (and is not read).
MAX_TRACKER_BYTES = 4096


def read_tracker(checkpoint_dir: str) -> tuple[int | None, str | None]:
    """``(step, None)`` from ``latest_checkpointed_iteration.txt``, or ``(None, problem)`` when it is
    missing, unreadable, empty or not a step number. Surrounding whitespace is allowed, as verl's
    ``int(text)`` allows it."""
    path = tracker_path(checkpoint_dir)
    if not os.path.lexists(path):
        return None, TRACKER_MISSING
    try:
        raw = read_regular(path, MAX_TRACKER_BYTES)
    except NotReadable as refused:
        return None, str(refused)
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"
    text = raw.decode("ascii", errors="replace").strip()
    if not raw.strip():
        return None, "is empty (a kill during a plain open('w') write leaves it so)"
    if not text.isdigit():  # its bytes are not quoted: the name may point at a file that is not ours to show
        return None, f"holds {len(raw)} bytes that are not a step number"
    return int(text), None


def _has_checkpoint_files(folder: str) -> bool:
    if not os.path.isdir(folder):
        return False
    return any(not name.endswith(TEMP_SUFFIX) for name in os.listdir(folder))


def _zip_problem(path: str) -> str | None:
    """Why ``path`` is not a whole zip archive with intact CRCs (reads it, unpickles nothing)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as err:  # BadZipFile, OSError, struct errors: all mean "not whole"
        return f"cut short or damaged ({type(err).__name__}: {err})"
    return f"damaged (CRC mismatch in {bad})" if bad else None


def check_folder(folder: str, *, async_enabled: bool, published: bool, use_critic: bool = False) -> FolderCheck:
    """Check that ``folder`` is a complete checkpoint (see the module doc); reads the input file once.

    ``published``: the tracker (or ``trainer.resume_from_path``) names the folder, so in async mode it
    may lack the input file (a checkpoint written without one loads as such), unless the file's
    temporary is there (its write was interrupted). Raises the input file's
    :class:`~agentlightning.verl.errors.InputCheckpointError` when the file is present at full
    length but invalid; every other shortcoming is reported in ``problem``.
    """
    problems: list[str] = []
    error: CheckpointError | None = None
    checkpoint = None
    try:
        checkpoint = read_input_checkpoint(folder, expected_step=step_of_folder(folder))
    except InputCheckpointTruncatedError as err:
        problems.append(f"has {INPUT_STATE_FILENAME} {err.problem.removeprefix('is ')}")
        error = err
    if checkpoint is None and error is None and async_enabled:
        interrupted = os.path.exists(temp_path(input_state_path(folder)))
        if interrupted:
            problems.append(f"has no {INPUT_STATE_FILENAME} (only its temporary file: its write was interrupted)")
        elif not published:
            problems.append(f"has no {INPUT_STATE_FILENAME}")
    if not _has_checkpoint_files(actor_path(folder)):
        problems.append("has no actor checkpoint")
    if use_critic and not _has_checkpoint_files(critic_path(folder)):
        problems.append("has no critic checkpoint")
    data_path = data_state_path(folder)
    if not os.path.exists(data_path):
        problems.append(f"has no {DATALOADER_FILENAME}")
    else:
        damage = _zip_problem(data_path)
        if damage:
            problems.append(f"has {DATALOADER_FILENAME} {damage}")
    if not problems:
        return FolderCheck(folder, None, checkpoint)
    problem = ", ".join(problems)
    if error is None or len(problems) > 1:
        error = CheckpointIncompleteError(folder, f"is incomplete: it {problem}", FIX_EXPLICIT_FOLDER)
    return FolderCheck(folder, problem, checkpoint, error)


def _explicit_folder(config: Any) -> str:
    folder = config.trainer.resume_from_path
    if not isinstance(folder, str) or not names_a_step_folder(folder):
        raise ValueError(
            f"trainer.resume_from_path={folder!r} must name a {STEP_FOLDER_PATTERN} folder when "
            "trainer.resume_mode=resume_path"
        )
    return os.path.abspath(folder)


def choose_resume_folder(config: Any, *, async_enabled: bool, use_critic: bool = False) -> ResumeChoice:
    """The folder a resume under ``config`` reads, chosen by the rules of the module doc.

    Warns (:class:`CheckpointFallbackWarning`, :class:`NoCompleteCheckpointWarning`) when ``auto`` does
    not use the tracker's folder; raises :class:`CheckpointIncompleteError` or an
    :class:`~agentlightning.verl.errors.InputCheckpointError` as the rules say.
    """
    mode = config.trainer.resume_mode
    if mode == "disable":
        return ResumeChoice(None, None)
    if mode == "resume_path":
        folder = _explicit_folder(config)
        if not os.path.isdir(folder):
            raise CheckpointIncompleteError(folder, "does not exist", FIX_EXPLICIT_FOLDER)
        check = check_folder(folder, async_enabled=async_enabled, published=True, use_critic=use_critic)
        if check.error is not None:
            raise check.error
        return ResumeChoice(folder, check.checkpoint)
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r} is not one of 'auto', 'resume_path', 'disable'")
    checkpoint_dir = os.path.abspath(config.trainer.default_local_dir)
    folders = step_folders(checkpoint_dir)
    tracker = tracker_path(checkpoint_dir)
    tracked, tracker_problem = read_tracker(checkpoint_dir)
    skipped: list[Skipped] = []
    if tracked is not None and tracked in folders:
        check = check_folder(folders[tracked], async_enabled=async_enabled, published=True, use_critic=use_critic)
        if check.complete:
            return ResumeChoice(check.folder, check.checkpoint)
        skipped.append(Skipped(check.folder, f"is incomplete: it {check.problem}"))
    elif tracked is not None:
        skipped.append(Skipped(tracker, f"names {step_folder_name(tracked)}, which does not exist"))
    elif tracker_problem is not None and (tracker_problem != TRACKER_MISSING or folders):
        skipped.append(Skipped(tracker, tracker_problem))
    for step in sorted(folders, reverse=True):
        if step == tracked:
            continue
        check = check_folder(folders[step], async_enabled=async_enabled, published=False, use_critic=use_critic)
        if check.complete:
            message = (
                f"auto resume uses {check.folder}, the newest complete checkpoint, because "
                + "; ".join(str(s) for s in skipped)
            )
            warnings.warn(CheckpointFallbackWarning(message, check.folder, skipped), stacklevel=3)
            return ResumeChoice(check.folder, check.checkpoint, tuple(skipped))
        skipped.append(Skipped(check.folder, f"is incomplete: it {check.problem}"))
    if skipped:
        message = (
            f"auto resume found no complete checkpoint in {checkpoint_dir} and starts fresh from step 0: "
            + "; ".join(str(s) for s in skipped)
        )
        warnings.warn(NoCompleteCheckpointWarning(message, None, skipped), stacklevel=3)
    return ResumeChoice(None, None, tuple(skipped))


def resolve_resume_folder(config: Any) -> str | None:
    """The folder *stock* verl's ``RayPPOTrainer._load_checkpoint`` reads under ``config`` (its rules:
    the tracker, unchecked), or None for a fresh start. Used to report what stock verl resumed from."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = config.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        return _explicit_folder(config)
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r} is not one of 'auto', 'resume_path', 'disable'")
    return find_latest_ckpt_path(os.path.abspath(config.trainer.default_local_dir))
