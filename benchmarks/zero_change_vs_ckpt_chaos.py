"""The same unmodified training script under resume-check (a zero-change command target) and under ckpt-chaos
0.1.8, side by side: what each flags and what a point costs. Prints figures; asserts nothing.

    python benchmarks/zero_change_vs_ckpt_chaos.py [--variants correct,in-place,by-name] [--ckpt-chaos PATH]

The script is docs/examples/recipes/zero_change/train.py (torch, 12 training steps, a checkpoint every second
step, the trained model written at the end), unchanged, in three variants chosen by its own flags:

- ``correct``: atomic saves (temporary file, fsync, rename), the newest checkpoint by step number;
- ``in-place``: ``torch.save`` to the checkpoint's final name (a crash can leave it torn);
- ``by-name``: the newest checkpoint by sorted name, so ``step_8.pt`` wins over ``step_10.pt``.

resume-check runs ``pytest --resume-matrix`` (the default quick matrix with its crash smoke cells, serial) on a
project whose conftest declares the script with ``checkpoints="step_*.pt"`` and ``outputs=["model.pt"]``.
ckpt-chaos runs ``ckpt-chaos run --checkpoint-glob {out}/step_*.pt --step-regex ... --result-file
{out}/model.pt --fail-on HARD_FAIL,SILENT_DIVERGENCE,LOST_WORK`` (its contract mode, the closest to what the
harness judges), from a virtual environment of its own (``--ckpt-chaos`` names its executable; without it, one
is made in a temporary folder with ``pip install ckpt-chaos==0.1.8``). The two tools alternate per variant.
A "point" is one cell for resume-check and one crash point for ckpt-chaos; the cost per point is the tool's
wall time over its points (each includes its reference runs).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from side_by_side import ckpt_chaos, ckpt_chaos_executable, print_rows, resume_check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "recipes" / "zero_change" / "train.py"
VARIANTS = {"correct": [], "in-place": ["--save", "in-place"], "by-name": ["--pick", "name"]}

CONFTEST = """from pytest_resume_check import resume_target

script = resume_target.command(
    ["{{python}}", "train.py", "--out", "{{checkpoint_dir}}", "--seed", "{{seed}}", *{flags!r}],
    name="unchanged_script", steps=6, checkpoints="step_*.pt", outputs=["model.pt"],
)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--ckpt-chaos", default=None, help="the ckpt-chaos executable (default: a fresh venv)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zero-change-bench-") as scratch:
        executable = ckpt_chaos_executable(args.ckpt_chaos, Path(scratch))
        for variant in args.variants.split(","):
            flags = VARIANTS[variant]
            ours, _ = resume_check(SCRIPT, CONFTEST.format(flags=flags), "unchanged_script",
                                   Path(scratch) / variant / "resume-check")
            theirs = ckpt_chaos(executable, SCRIPT, flags, "step_*.pt", Path(scratch) / variant / "ckpt-chaos")
            rows += [(variant, "resume-check", ours), (variant, "ckpt-chaos", theirs)]
    print_rows(rows)


if __name__ == "__main__":
    main()
