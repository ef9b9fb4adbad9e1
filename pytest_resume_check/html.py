"""The HTML report, public path: ``pytest_resume_check.html.write_report(results, path)``.

The report is built in :mod:`pytest_resume_check.report.html`; this module keeps the path users
import (docs/reading-a-report.md) working.
"""

from __future__ import annotations

from pytest_resume_check.report.html import render, write_report

__all__ = ["render", "write_report"]
