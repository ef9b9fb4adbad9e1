"""A training script that commits each checkpoint through a pointer file, as DeepSpeed (``latest``), Megatron-LM
and verl (``latest_checkpointed_iteration.txt``) do, and knows nothing of resume-check: it writes ``ckpt_<step>.pt``,
then ``latest.txt`` naming it, and resumes from the checkpoint ``latest.txt`` names.

Two mistakes people make are flags, so the harness can be shown what each costs: ``--order pointer-first`` writes
``latest.txt`` before the checkpoint it names (a crash between the two leaves a pointer to a file that is not
there), ``--scheduler unsaved`` leaves the learning-rate scheduler out of the checkpoint (a resumed run decays the
learning rate at other steps).
"""

import argparse
import functools
import os

import torch

POINTER = "latest.txt"


def write_atomically(path, write):
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def write_name(name, f):
    f.write(name.encode())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", choices=["checkpoint-first", "pointer-first"], default="checkpoint-first")
    parser.add_argument("--scheduler", choices=["saved", "unsaved"], default="saved")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(args.seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    start = 0
    pointer = os.path.join(args.out, POINTER)
    if os.path.exists(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        state = torch.load(os.path.join(args.out, name))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        start = state["step"]
        print(f"resumed from step {start} ({name})", flush=True)

    for step in range(start + 1, args.steps + 1):
        batch = torch.Generator().manual_seed(args.seed * 1000 + step)
        x = torch.randn(8, 4, generator=batch)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            if args.scheduler == "saved":
                state["scheduler"] = scheduler.state_dict()
            name = f"ckpt_{step}.pt"
            if args.order == "pointer-first":
                write_atomically(pointer, functools.partial(write_name, name))
            write_atomically(os.path.join(args.out, name), functools.partial(torch.save, state))
            if args.order == "checkpoint-first":
                write_atomically(pointer, functools.partial(write_name, name))
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    print(f"trained to step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
