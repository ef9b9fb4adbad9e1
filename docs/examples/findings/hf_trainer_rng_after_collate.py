"""transformers' Trainer, resumed from a checkpoint inside an epoch, masks the first resumed batch
differently from a run that was never interrupted, when the collator draws from the global RNG
(``DataCollatorForLanguageModeling``, the masked-LM default) and loading runs in the main process
(``dataloader_num_workers=0``, the default).

Why: ``Trainer._run_epoch`` restores the checkpoint's RNG state (``_load_rng_state``) only after
``get_batch_samples`` fetched the first batches of the resumed epoch, so they are collated from the
new process's RNG. In the uninterrupted run the batch after the checkpoint was collated before the
checkpoint was even written (accelerate's loader fetches one batch ahead), from the RNG of the run.
An epoch-boundary resume restores the RNG before the loader starts and is exact.

Run it: ``python hf_trainer_rng_after_collate.py``. It trains 2 steps uninterrupted, then resumes
from the step-1 checkpoint, prints which tokens step 2 masked in each, and exits with status 1 while
the two differ (transformers 5.10), 0 once they agree.
"""

from __future__ import annotations

import sys
import tempfile

import torch
from tokenizers import Tokenizer, models
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = 64
SEED = 7


class Rows(torch.utils.data.Dataset):
    def __init__(self):
        self.rows = torch.randint(len(SPECIAL), VOCAB, (8, 8), generator=torch.Generator().manual_seed(1234))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


class MaskedPositions(TrainerCallback):
    """Records, per optimizer step, which positions the batch's labels ask the model to predict."""

    def __init__(self):
        self.masked = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def hook(module, positional, inputs):
            self.masked[state.global_step + 1] = (inputs["labels"] != -100).nonzero().tolist()

        self.handle = model.register_forward_pre_hook(hook, with_kwargs=True)

    def on_train_end(self, args, state, control, **kwargs):
        self.handle.remove()


def train(output_dir, resume=None):
    set_seed(SEED)
    vocab = {**{t: i for i, t in enumerate(SPECIAL)}, **{f"w{i}": i for i in range(len(SPECIAL), VOCAB)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                        pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=16))
    args = TrainingArguments(output_dir=output_dir, use_cpu=True, seed=SEED, per_device_train_batch_size=4,
                             num_train_epochs=1, save_strategy="steps", save_steps=1, logging_strategy="no",
                             report_to=[], disable_tqdm=True)
    recorder = MaskedPositions()
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[recorder],
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15))
    trainer.train(resume_from_checkpoint=resume)
    return recorder.masked


def main() -> int:
    with tempfile.TemporaryDirectory() as straight_dir, tempfile.TemporaryDirectory() as resumed_dir:
        straight = train(straight_dir)  # 8 examples, batches of 4: steps 1 and 2, a checkpoint after each
        resumed = train(resumed_dir, resume=f"{straight_dir}/checkpoint-1")  # what a new process does
    print("step 2 masks (row, position), uninterrupted:", straight[2])
    print("step 2 masks (row, position), resumed:      ", resumed[2])
    return 0 if resumed[2] == straight[2] else 1


if __name__ == "__main__":
    sys.exit(main())
