"""Fine-tunes a small BERT classifier with Hugging Face's Trainer: the job as its authors wrote it, before
anyone tested its resume. The model is built from a config and the data is synthetic, so nothing is
downloaded.

    python trainer.py --output-dir out            # train; checkpoints in out/checkpoint-N
    python trainer.py --output-dir out --resume   # after a crash: go on from the last checkpoint, if any
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

VOCAB = 64
SEQ_LEN = 8


class Reviews(torch.utils.data.Dataset):
    """12 token sequences with a binary label and their row number, "idx" (as GLUE datasets have)."""

    def __init__(self, n: int = 12):
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(1, VOCAB, (n, SEQ_LEN), generator=generator)
        self.labels = (self.tokens.sum(dim=1) % 2).tolist()

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"idx": i, "input_ids": self.tokens[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


def build_trainer(output_dir: str, *, seed: int = 42, callbacks: Sequence[TrainerCallback] = (),
                  **overrides: Any) -> Trainer:
    """The Trainer of this job. ``overrides`` replace TrainingArguments (e.g. dataloader_num_workers=2)."""
    set_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    options = {
        "output_dir": output_dir,
        "seed": seed,
        "use_cpu": True,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 4,  # 12 examples: 3 steps an epoch
        "learning_rate": 1e-3,
        "save_strategy": "steps",
        "save_steps": 2,
        "save_total_limit": 2,
        "logging_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        **overrides,
    }
    return Trainer(model=BertForSequenceClassification(config), args=TrainingArguments(**options),
                   train_dataset=Reviews(), data_collator=default_data_collator, callbacks=list(callbacks))


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The checkpoint to go on from: the newest checkpoint-N in ``output_dir``, or None to start fresh."""
    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output-dir")
    args = parser.parse_args(argv)
    resume = last_checkpoint(args.output_dir) if args.resume else None
    build_trainer(args.output_dir).train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
