"""A training script that commits each checkpoint through a pointer file, unmodified, under resume-check (a
zero-change command target) and under ckpt-chaos 0.1.8, side by side: what each flags, where the script is correct
(false alarms) and where it is not, and what a point costs. Prints figures; asserts nothing.

    python benchmarks/zero_change_pointer_vs_ckpt_chaos.py [--variants correct,pointer-first,scheduler]
        [--ckpt-chaos PATH]

The script is docs/examples/recipes/pointer/train.py (torch, 12 training steps, a checkpoint ``ckpt_<step>.pt``
every second step, then ``latest.txt`` naming it, the trained model written at the end; it resumes from the
checkpoint ``latest.txt`` names), unchanged, in three variants chosen by its own flags:

- ``correct``: the checkpoint (temporary file, fsync, rename), then the pointer (the same way);
- ``pointer-first``: the pointer before the checkpoint it names (a crash between the two leaves a pointer to a file
  that is not there);
- ``scheduler``: the learning-rate scheduler left out of the checkpoint (a resumed run decays at other steps).

resume-check runs ``pytest --resume-matrix`` (the default quick matrix with its crash smoke cells, serial) on a
project whose conftest declares the script with ``checkpoints="ckpt_*.pt"``, ``outputs=["model.pt"]`` and
``commit="latest.txt"`` (row ``resume-check``), and once more without ``commit=``, which the harness then recognises
in the uninterrupted run (row ``rc recognised``). ckpt-chaos runs ``ckpt-chaos run --checkpoint-glob
{out}/ckpt_*.pt --step-regex ... --result-file {out}/model.pt --fail-on HARD_FAIL,SILENT_DIVERGENCE,LOST_WORK``
(its contract mode, the closest to what the harness judges; it has no notion of a pointer), from a virtual
environment of its own (``--ckpt-chaos`` names its executable; without it, one is made in a temporary folder with
``pip install ckpt-chaos==0.1.8``). The tools alternate per variant. A "point" is one cell for resume-check and one
crash point for ckpt-chaos; the cost per point is the tool's wall time over its points (each includes its
reference runs). A flag on the correct variant is a false alarm; no flag on another is a miss.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from side_by_side import ckpt_chaos, ckpt_chaos_executable, resume_check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "recipes" / "pointer" / "train.py"
VARIANTS = {"correct": [], "pointer-first": ["--order", "pointer-first"], "scheduler": ["--scheduler", "unsaved"]}

CONFTEST = """from pytest_resume_check import resume_target

script = resume_target.command(
    ["{{python}}", "train.py", "--out", "{{checkpoint_dir}}", "--seed", "{{seed}}", *{flags!r}],
    name="pointer_script", steps=6, checkpoints="ckpt_*.pt", outputs=["model.pt"],{commit}
)
"""


def pointer_matrix(flags: list[str], folder: Path, declared: bool) -> dict:
    commit = ' commit="latest.txt",' if declared else ""
    figures, output = resume_check(SCRIPT, CONFTEST.format(flags=flags, commit=commit), "pointer_script", folder)
    if "recognised as the commit point" in output:
        figures["note"] = "latest.txt recognised"
    return figures


def judgement(variant: str, flagged: int) -> str:
    """What a tool's flags on a variant amount to."""
    if variant == "correct":
        return f"{flagged} false alarm{'s' if flagged != 1 else ''}" if flagged else "no false alarm"
    return "caught" if flagged else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--ckpt-chaos", default=None, help="the ckpt-chaos executable (default: a fresh venv)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pointer-bench-") as scratch:
        executable = ckpt_chaos_executable(args.ckpt_chaos, Path(scratch))
        for variant in args.variants.split(","):
            flags = VARIANTS[variant]
            base = Path(scratch) / variant
            rows.append((variant, "resume-check", pointer_matrix(flags, base / "declared", declared=True)))
            chaos = ckpt_chaos(executable, SCRIPT, flags, "ckpt_*.pt", base / "ckpt-chaos")
            rows.append((variant, "ckpt-chaos", chaos))
            rows.append((variant, "rc recognised", pointer_matrix(flags, base / "recognised", declared=False)))
    print(f"{'variant':<13} {'tool':<13} {'points':>6} {'flagged':>7} {'wall s':>7} {'s/point':>7}  "
          f"{'judgement':<16} what was flagged")
    for variant, tool, r in rows:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items())) or "-"
        note = f" ({r['note']})" if r["note"] else ""
        print(f"{variant:<13} {tool:<13} {r['points']:>6} {r['flagged']:>7} {r['seconds']:>7.1f} "
              f"{r['seconds'] / max(1, r['points']):>7.2f}  {judgement(variant, r['flagged']):<16} {kinds}{note}")


if __name__ == "__main__":
    main()
