"""A module that reads an environment variable when imported, as ``huggingface_hub`` reads ``HF_HUB_OFFLINE``:
a program importing it sees the value its interpreter had at the import (tests/support/fresh_equivalence_program.py,
mode ``env_at_import``)."""

import os

#: The variable a command target sets with ``env=``.
NAME = "RESUME_CHECK_EQUIVALENCE_SETTING"
SETTING = os.environ.get(NAME, "unset")
