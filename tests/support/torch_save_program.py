"""A training program that knows nothing of resume-check and saves with ``torch.save`` to a path, run as a
zero-change command target: ``python torch_save_program.py OUT [--legacy]``.

Its "model" is one tensor updated each step; every step it saves ``ckpt_<n>.pt`` under its final name (no
temporary file: the save is one ``torch.save``), resumes from the newest one it finds and writes ``model.json``
at the end. ``--legacy`` saves in torch's legacy format (``_use_new_zipfile_serialization=False``), which writes
through Python's ``open`` where the zip format writes from C++: the harness must count each save once either way.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import torch

STEPS = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args()
    options = {"_use_new_zipfile_serialization": False} if args.legacy else {}
    paths = glob.glob(os.path.join(args.out, "ckpt_*.pt"))
    start, weight = 0, torch.zeros(3)
    if paths:
        saved = torch.load(max(paths, key=lambda p: int(os.path.basename(p)[5:-3])))
        start, weight = saved["step"], saved["weight"]
    for step in range(start + 1, STEPS + 1):
        weight = weight * 0.5 + step
        torch.save({"step": step, "weight": weight}, os.path.join(args.out, f"ckpt_{step}.pt"), **options)
    with open(os.path.join(args.out, "model.json"), "w") as f:  # not a legacy file: its bytes hold addresses
        json.dump(weight.tolist(), f)


if __name__ == "__main__":
    main()
