"""Errors of a target's declaration, shared by the declaring side and the parts that load and run targets."""

from __future__ import annotations


class TargetError(Exception):
    """A target declaration or its loading is broken; the message names the target and the fix."""
