"""Put first on the ``PYTHONPATH`` of a zero-change command target's program by the harness: watch the
program's checkpoint files (:mod:`pytest_resume_check.child.watch`), then run the ``sitecustomize`` this
one hides, if any. Outside the harness (no run's socket in the environment) it only does the latter."""

try:
    from pytest_resume_check.child import watch
except ImportError as exc:  # another interpreter than the one running pytest
    import sys

    print(f"resume-check: this interpreter ({sys.executable}) cannot import pytest_resume_check ({exc}), so the "
          "checkpoints of this program are not watched; start it with {python}", file=sys.stderr)
else:
    watch.install()
    watch.run_hidden_sitecustomize(__file__)
