"""A training script that knows nothing of resume-check: it trains a small torch model, saves a checkpoint
every few steps, resumes from the newest one it finds and writes the trained model at the end.

Its two choices people make either way are flags, so the harness can be shown what each costs:
``--save atomic`` (a temporary file, fsync, rename) or ``in-place`` (``torch.save`` to the final name), and
``--pick number`` (the newest checkpoint by its step number) or ``name`` (the last name in sorted order,
which puts ``step_10.pt`` before ``step_8.pt``).
"""

import argparse
import glob
import os

import torch


def newest_checkpoint(out, pick):
    paths = glob.glob(os.path.join(out, "step_*.pt"))
    if not paths:
        return None
    if pick == "name":
        return sorted(paths)[-1]
    return max(paths, key=lambda p: int(os.path.basename(p)[len("step_"):-len(".pt")]))


def save(state, path, how):
    if how == "in-place":
        torch.save(state, path)
        return
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", choices=["atomic", "in-place"], default="atomic")
    parser.add_argument("--pick", choices=["number", "name"], default="number")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(args.seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = newest_checkpoint(args.out, args.pick)
    if checkpoint is not None:
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from step {start} ({checkpoint})", flush=True)

    for step in range(start + 1, args.steps + 1):
        batch = torch.Generator().manual_seed(args.seed * 1000 + step)
        x = torch.randn(8, 4, generator=batch)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            save(state, os.path.join(args.out, f"step_{step}.pt"), args.save)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    print(f"trained to step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
