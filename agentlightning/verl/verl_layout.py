"""verl's checkpoint folder layout: the one place that knows its names.

Under ``trainer.default_local_dir`` verl (0.8 and 0.9) keeps::

    latest_checkpointed_iteration.txt    the tracker: the step of the newest published checkpoint
    global_step_N/                        the state after N optimizer steps
        actor/                            the actor checkpoint, written by the worker group
        critic/                           the critic checkpoint, when a critic is used
        data.pt                           the data loader state (``torch.save``)
        agentlightning_input.pt           ours, async mode only: see agentlightning.verl.input_file

Every other module builds these paths with the functions below. This module imports only the
standard library, so the resume-check target can use it without loading torch or verl.
"""

from __future__ import annotations

import os
import re

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
STEP_FOLDER_PREFIX = "global_step_"
DATALOADER_FILENAME = "data.pt"
ACTOR_FOLDER = "actor"
#: ``str(verl.trainer.ppo.utils.Role.Critic)`` in verl 0.8 and 0.9.
CRITIC_FOLDER = "critic"
#: The input file this package adds to a step folder (its format: agentlightning.verl.input_format).
INPUT_STATE_FILENAME = "agentlightning_input.pt"
#: How messages name "some step folder".
STEP_FOLDER_PATTERN = f"{STEP_FOLDER_PREFIX}N"

_STEP_FOLDER_RE = re.compile(rf"^{re.escape(STEP_FOLDER_PREFIX)}(\d+)$")


def step_folder_name(step: int) -> str:
    """``global_step_<step>``."""
    return f"{STEP_FOLDER_PREFIX}{step}"


def step_folder_path(checkpoint_dir: str, step: int) -> str:
    """``<checkpoint_dir>/global_step_<step>``, as verl builds it (relative if ``checkpoint_dir`` is)."""
    return os.path.join(checkpoint_dir, step_folder_name(step))


def tracker_path(checkpoint_dir: str) -> str:
    """``<checkpoint_dir>/latest_checkpointed_iteration.txt``."""
    return os.path.join(checkpoint_dir, TRACKER_FILENAME)


def actor_path(step_folder: str) -> str:
    """The actor checkpoint folder inside a step folder."""
    return os.path.join(step_folder, ACTOR_FOLDER)


def critic_path(step_folder: str) -> str:
    """The critic checkpoint folder inside a step folder."""
    return os.path.join(step_folder, CRITIC_FOLDER)


def data_state_path(step_folder: str) -> str:
    """The data loader state (``data.pt``) inside a step folder."""
    return os.path.join(step_folder, DATALOADER_FILENAME)


def input_state_path(step_folder: str) -> str:
    """The input file (``agentlightning_input.pt``) inside a step folder."""
    return os.path.join(step_folder, INPUT_STATE_FILENAME)


def names_a_step_folder(path: str) -> bool:
    """Whether ``path`` looks like a step folder to verl (it holds the prefix somewhere)."""
    return STEP_FOLDER_PREFIX in path


def step_of_folder(folder: str) -> int:
    """The global step encoded in a ``global_step_N`` folder name (verl's rule)."""
    return int(os.path.normpath(folder).split(STEP_FOLDER_PREFIX)[-1])


def step_folders(checkpoint_dir: str) -> dict[int, str]:
    """``{step: path}`` of the ``global_step_N`` folders in ``checkpoint_dir`` (empty if it is missing)."""
    if not os.path.isdir(checkpoint_dir):
        return {}
    found = {}
    for name in os.listdir(checkpoint_dir):
        match = _STEP_FOLDER_RE.match(name)
        path = os.path.join(checkpoint_dir, name)
        if match and os.path.isdir(path):
            found[int(match.group(1))] = path
    return found
