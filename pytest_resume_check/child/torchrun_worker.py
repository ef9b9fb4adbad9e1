"""The script torchrun's agent runs in each worker of a torchrun job the harness started (``--run-path``:
in the worker process, forked from the agent). Run by path, never imported for its effect."""

if __name__ == "__main__":
    from pytest_resume_check.child.main import torchrun_worker

    torchrun_worker()
