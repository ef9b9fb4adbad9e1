"""Every option and ini key the docs name is offered by ``pytest --help`` in a fresh pytest with the plugin."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Every option and ini key the docs name.
OPTIONS = ("--resume-matrix", "--resume-matrix-mode", "--resume-matrix-seed", "--resume-matrix-target",
           "--resume-matrix-cell", "--resume-matrix-hang-timeout", "--resume-matrix-json",
           "--resume-matrix-isolation", "--resume-matrix-exhaustive", "--resume-matrix-html",
           "--resume-matrix-repro", "--resume-matrix-step-summary")
INI_KEYS = ("resume_matrix_targets", "resume_matrix_seed", "resume_matrix_hang_timeout", "resume_matrix_json",
            "resume_matrix_isolation", "resume_matrix_exhaustive", "resume_matrix_html", "resume_matrix_repro",
            "resume_matrix_step_summary")


@pytest.mark.slow
def test_every_option_and_ini_key_the_docs_name_is_offered():
    shown = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    missing = [name for name in (*OPTIONS, *INI_KEYS) if name not in shown]
    assert not missing, f"pytest --help does not offer {missing}"
