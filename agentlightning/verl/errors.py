"""The typed errors of checkpoints a resume cannot use, and the fixes their messages suggest.

Every error carries ``path``, ``problem`` and ``fix`` and reads ``<path>: <problem>. <fix>``. They are
plain data, defined below the modules that raise them (the input file, the choice of the resume folder,
verl's save and load steps), so a caller can catch them without importing those modules.
"""

from __future__ import annotations

from typing import Any

from agentlightning.verl.verl_layout import STEP_FOLDER_PATTERN

FIX_OTHER_CHECKPOINT = (
    "Resume from another checkpoint with trainer.resume_mode=resume_path "
    f"trainer.resume_from_path=<an earlier {STEP_FOLDER_PATTERN} folder>, or delete this global_step folder"
)
FIX_UPGRADE = (
    "Upgrade agentlightning to a release that reads it, or resume from another checkpoint with "
    f"trainer.resume_mode=resume_path trainer.resume_from_path=<{STEP_FOLDER_PATTERN} folder>"
)


class CheckpointError(RuntimeError):
    """A checkpoint a resume cannot use; the message names the path, the problem and the fix."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path}: {problem}. {fix}")


class CheckpointIncompleteError(CheckpointError):
    """A folder named by ``trainer.resume_from_path`` is missing or incomplete."""


class DataLoaderCheckpointError(CheckpointError):
    """``data.pt`` cannot be loaded with ``torch.load(weights_only=True)``."""


class InputCheckpointError(CheckpointError):
    """A problem with an input file (``agentlightning_input.pt``)."""


class InputCheckpointVersionError(InputCheckpointError):
    """The file was written in a format version this code does not read (``supported`` lists those it
    reads)."""

    def __init__(self, path: str, found: Any, supported: tuple[int, ...]) -> None:
        self.found = found
        self.supported = supported
        names = ", ".join(str(v) for v in supported)
        super().__init__(
            path, f"input checkpoint format version {found!r} is not supported (supported: {names})", FIX_UPGRADE
        )


class InputCheckpointCorruptError(InputCheckpointError):
    """The file is damaged or crafted: unreadable, a checksum mismatch, sizes it claims but does not hold
    (refused before anything of that size is allocated), missing entries or entries of wrong types."""


class InputCheckpointTruncatedError(InputCheckpointCorruptError):
    """The file is cut short: the beginning of a torch zip archive without its end (or empty)."""


class InputCheckpointUnsafeError(InputCheckpointCorruptError):
    """The file holds pickled code that loading would run: its pickle names a global (the message says
    which) other than those ``torch.save`` writes for plain tensors. It is refused before ``torch.load``
    runs, so nothing ran; the message never suggests loading it with pickled code enabled."""


class InputCheckpointStepMismatchError(InputCheckpointError):
    """The step recorded in the file differs from the step of the folder that holds it."""


class InputCheckpointEncodeError(InputCheckpointError):
    """A value in the input state cannot be stored as tensors and plain Python values."""
