"""The GPUs a run of a target may use on this machine, so GPU runs that run at once never share a device.

A target that declares GPUs (``resources={"GPU": 1}``) gets ``CUDA_VISIBLE_DEVICES`` in each run's
environment: the devices of this pytest process (its own ``CUDA_VISIBLE_DEVICES``, else the NVIDIA
driver's list in ``/proc``), cut in one share per pytest-xdist worker, worker *k* taking share *k*. A
pytest process without xdist takes the first share; a Ray task's pytest sees only the devices Ray gave
it. A target that declares no GPU runs with the environment as it is.

Nothing here initialises CUDA or imports torch: a forked run would then be unable to use the GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from pytest_resume_check.records.names import OPT_RAY

#: The variable CUDA reads to choose the devices a process sees.
CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"
#: One folder per GPU the NVIDIA driver found (Linux).
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
#: What pytest-xdist sets in each worker: its name (``gw0``, ``gw1``, ...) and how many there are.
XDIST_WORKER, XDIST_WORKERS = "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"

ERR_NO_GPU = ("target {name!r} needs {gpus:g} GPU{s} a run (resources=), and this machine shows too few ({why}); "
              "run it where there are (a Ray cluster with GPUs: " + OPT_RAY + "), or declare no GPU")
ERR_TOO_FEW = ("target {name!r} needs {gpus:g} GPU{s} a run (resources=), and {worker} (of {workers} pytest-xdist "
               "workers) has none of this machine's {count} devices ({devices}) left to itself; run with -n {most} "
               "or fewer, so GPU runs never share a device")


def visible_devices(environ: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """This process's GPUs as ``CUDA_VISIBLE_DEVICES`` names them, and where the list came from."""
    environ = os.environ if environ is None else environ
    if CUDA_DEVICES in environ:
        named = [d.strip() for d in environ[CUDA_DEVICES].split(",") if d.strip()]
        return named, f"{CUDA_DEVICES}={environ[CUDA_DEVICES]!r}"
    try:
        count = len(os.listdir(NVIDIA_GPUS))
    except OSError:
        return [], f"no {CUDA_DEVICES} and no {NVIDIA_GPUS}"
    return [str(i) for i in range(count)], f"{count} in {NVIDIA_GPUS}"


def worker_slot(environ: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """(this worker's index, how many workers, its name): ``(0, 1, "this pytest process")`` without xdist."""
    environ = os.environ if environ is None else environ
    name = environ.get(XDIST_WORKER, "")
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]), max(int(environ.get(XDIST_WORKERS, "1") or 1), int(name[2:]) + 1), f"worker {name}"
    return 0, 1, "this pytest process"


def device_env(name: str, gpus: float, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a run of target ``name`` that needs ``gpus`` GPUs gets: its worker's devices
    (nothing for ``gpus`` 0). ValueError with one line naming the fix when there are not enough."""
    if gpus <= 0:
        return {}
    need = math.ceil(gpus)
    devices, why = visible_devices(environ)
    index, workers, worker = worker_slot(environ)
    s = "" if need == 1 else "s"
    if len(devices) < need:
        shown = why if not devices else f"only {len(devices)}: {why}"
        raise ValueError(ERR_NO_GPU.format(name=name, gpus=gpus, s=s, why=shown))
    share = devices[index * need:(index + 1) * need]
    if len(share) < need:
        raise ValueError(ERR_TOO_FEW.format(name=name, gpus=gpus, s=s, worker=worker, workers=workers,
                                            count=len(devices), devices=",".join(devices),
                                            most=max(len(devices) // need, 1)))
    return {CUDA_DEVICES: ",".join(share)}
