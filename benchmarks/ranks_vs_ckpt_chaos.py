"""The same two-rank training script under resume-check (a command target with ``world_size=2``) and under
ckpt-chaos 0.1.8 (``--ranks 2``, once with each ``--crash-rank``), side by side: what each flags and what an
explored crash point costs. Prints figures; asserts nothing.

    python benchmarks/ranks_vs_ckpt_chaos.py [--variants correct,tracker_first,...] [--ckpt-chaos PATH]
                                             [--crash-ranks 0,1] [--max-points 12]

The script is benchmarks/two_rank_train.py (gloo, DCP checkpoints every step, ``latest`` published by rank 0
after a barrier, the trained model written at the end), unchanged, in five variants: ``correct`` and its planted
``--bug`` values. resume-check runs ``pytest --resume-matrix`` (the default quick matrix, its crash smoke cells on
both ranks included, serial) on a project whose conftest declares the script with ``outputs=["model.pt"]``.
ckpt-chaos runs its contract mode (``--checkpoint-glob {out}/step_* --step-regex ... --result-file {out}/model.pt
--fail-on HARD_FAIL,SILENT_DIVERGENCE,LOST_WORK``) from a virtual environment of its own (``--ckpt-chaos`` names
its executable; without it one is made with ``pip install ckpt-chaos==0.1.8``), once per ``--crash-ranks`` rank,
capped at ``--max-points`` crash points each (its own option, evenly sampled: uncapped it explores every file
operation of every step's save, more than 35 points at 20 s each here). A "point" is one cell for
resume-check and one crash point for ckpt-chaos; the cost per point is the tool's wall time over its points
(each includes its reference runs). The tools alternate per variant.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from side_by_side import ckpt_chaos, ckpt_chaos_executable, print_rows, resume_check

SCRIPT = Path(__file__).resolve().parent / "two_rank_train.py"
VARIANTS = {"correct": [], **{bug: ["--bug", bug] for bug in
                              ("tracker_first", "newest_folder", "prune_early", "async_prune")}}

CONFTEST = """from pytest_resume_check import resume_target

script = resume_target.command(
    ["{{python}}", "train.py", "--out", "{{checkpoint_dir}}", "--seed", "{{seed}}", *{flags!r}],
    name="two_rank_script", steps=8, world_size=2, outputs=["model.pt"], resume_modes=("auto",),
)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--ckpt-chaos", default=None, help="the ckpt-chaos executable (default: a fresh venv)")
    parser.add_argument("--crash-ranks", default="0,1", help="ckpt-chaos's --crash-rank values, one run each")
    parser.add_argument("--max-points", type=int, default=12, help="ckpt-chaos's --max-points")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ranks-bench-") as scratch:
        executable = ckpt_chaos_executable(args.ckpt_chaos, Path(scratch))
        for variant in args.variants.split(","):
            flags = VARIANTS[variant]
            ours, _ = resume_check(SCRIPT, CONFTEST.format(flags=flags), "two_rank_script",
                                   Path(scratch) / variant / "resume-check")
            rows.append((variant, "resume-check", ours))
            for rank in args.crash_ranks.split(","):
                theirs = ckpt_chaos(executable, SCRIPT, flags, "step_*", Path(scratch) / variant / f"ckpt-chaos{rank}",
                                    ("--ranks", "2", "--crash-rank", rank, "--max-points", str(args.max_points)))
                rows.append((variant, f"ckpt-chaos r{rank}", theirs))
    print_rows(rows)


if __name__ == "__main__":
    main()
