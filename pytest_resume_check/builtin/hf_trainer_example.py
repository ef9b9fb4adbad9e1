"""A tiny causal language model fine-tuned with Hugging Face's ``Trainer``, checked through the
``hf_trainer`` integration (:class:`pytest_resume_check.integrations.hf_trainer.HFTrainerResumeCheck`).

Written the way a Trainer user writes a job: a model built from a config (nothing downloaded), a
map-style dataset of fixed token rows, ``default_data_collator``, ``TrainingArguments`` on the CPU and
``trainer.train(resume_from_checkpoint=...)`` with the job's own choice of checkpoint
(:func:`checkpoint_to_resume`: ``get_last_checkpoint`` of the output directory, as the Transformers example
scripts do, or the run's ``resume_path``), which the matrix tests. The Trainer shuffles with its own random sampler
(accelerate's ``SeedableRandomSampler``, seeded with ``seed + epoch``), skips the batches a resumed epoch
already trained on, and restores the RNG state, so its resumes are exact, except one: resumed inside an
epoch, it collates the first batches before restoring the RNG, so a masking collator masks them differently
(the ``mlm`` case; its affected cells are declared expected failures).

Case keys: ``n`` examples, ``batch`` (per device), ``accum`` (gradient accumulation steps), ``epochs``,
``workers`` (dataloader workers), ``save_steps`` (the Trainer's own ``save_strategy="steps"``; 0: only
the checkpoints the harness asks for), ``keep`` (``save_total_limit``; 0: keep all) and ``mlm`` (a tiny
BERT masked LM with ``DataCollatorForLanguageModeling`` instead of the GPT-2 causal LM).

Planted bugs (module-level targets, not in :data:`TARGETS`): :func:`hf_trainer_ignore_data_skip`,
:func:`hf_trainer_save_only_model`, :func:`hf_trainer_name_sorted_resume` (the newest checkpoint taken as
the last folder name in sorted order: ``checkpoint-9`` after ``checkpoint-10``) and
:func:`hf_trainer_unsaved_anneal` (a ``Trainer`` subclass whose loss anneals with a count kept on ``self``, which
no checkpoint holds). transformers is imported inside the functions: loading this module costs nothing, and
:data:`TARGETS` is empty where transformers is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from pytest_resume_check.builtin.epochs import AccumulatedEpochs
from pytest_resume_check.ids import WithIds
from pytest_resume_check.integrations.durable import leaves_incomplete
from pytest_resume_check.run import RESUME_AUTO, RESUME_DISABLED, RESUME_PATH, RunContext, RunPlan
from pytest_resume_check.targets import resume_target

VOCAB = 64
SEQ_LEN = 8
MLM_CASE = "mlm"
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_CASE = {"n": 12, "batch": 4, "accum": 1, "epochs": 2, "workers": 0, "save_steps": 0, "keep": 0, "mlm": False}

#: Planted bugs.
#: ``ignore_data_skip=True``: a resumed run starts its epoch from the first batch again -> DUPLICATED
IGNORE_DATA_SKIP = "ignore_data_skip"
#: ``save_only_model=True``: checkpoints hold the weights only, and the Trainer resumes from them
#: without a word, with a fresh optimizer, LR schedule and RNG -> STATE_DIVERGED
SAVE_ONLY_MODEL = "save_only_model"
#: The newest checkpoint taken by folder name: ``checkpoint-9`` sorts after ``checkpoint-10`` -> STALE_RESUME
NAME_SORTED = "name_sorted"
#: A z-loss whose weight anneals with a count of loss computations kept on the Trainer, not in its checkpoints:
#: a resumed run starts the anneal over -> STATE_DIVERGED at the first step after every resume, model first
UNSAVED_ANNEAL = "unsaved_anneal"
#: The planted z-loss: its full weight, and the loss computations it takes to get there.
Z_LOSS, Z_LOSS_WARMUP = 1e-2, 8


#: The case's step counts (pytest_resume_check.builtin.epochs).
_EPOCHS = AccumulatedEpochs(DEFAULT_CASE, "accum")
params, steps_per_epoch = _EPOCHS.params, _EPOCHS.steps_per_epoch
total_steps, epoch_boundaries = _EPOCHS.total_steps, _EPOCHS.epoch_boundaries


class TokenRows:
    """Map-style dataset of fixed random token rows (ids above the special tokens). For a causal LM each
    example is its own label; for masked LM the collator makes the labels."""

    def __init__(self, n: int, labels: bool = True):
        import torch

        self.rows = torch.randint(len(SPECIAL), VOCAB, (n, SEQ_LEN), generator=torch.Generator().manual_seed(1234))
        self.labels = labels

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        return {"input_ids": row, "labels": row} if self.labels else {"input_ids": row}


def word_level_tokenizer() -> Any:
    """A BERT-style tokenizer built in code (nothing downloaded): one word per token id."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {**{token: i for i, token in enumerate(SPECIAL)}, **{f"w{i}": i for i in range(len(SPECIAL), VOCAB)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]")


def model_and_data(p: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(model, train dataset, collator) of a case: a causal LM with fixed labels, or (``mlm``) a masked LM
    whose collator masks 15% of the tokens at random, drawing from the global torch RNG."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        GPT2Config,
        GPT2LMHeadModel,
        default_data_collator,
    )

    if p["mlm"]:
        bert_config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=16, pad_token_id=0)
        collator = DataCollatorForLanguageModeling(word_level_tokenizer(), mlm_probability=0.15)
        return BertForMaskedLM(bert_config), WithIds(TokenRows(p["n"], labels=False)), collator
    gpt2_config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=16, bos_token_id=0,
                             eos_token_id=0)
    return GPT2LMHeadModel(gpt2_config), WithIds(TokenRows(p["n"])), default_data_collator


@functools.cache
def annealed_z_loss_trainer() -> type:
    """Planted bug: a ``Trainer`` subclass that adds a z-loss (the squared log-partition of the logits) whose
    weight grows with a count of ``compute_loss`` calls kept on ``self``. The Trainer saves the model, the
    optimizer, the schedule and the RNGs, not its subclass's attributes, so a resumed run starts the anneal
    over and trains on another loss from its first step on. Defined on first use, so that importing this
    module does not import transformers."""
    import torch
    from transformers import Trainer

    class AnnealedZLossTrainer(Trainer):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.loss_calls = 0

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            self.loss_calls += 1
            z_loss = torch.logsumexp(outputs.logits, dim=-1).pow(2).mean()
            loss = loss + Z_LOSS * min(1.0, self.loss_calls / Z_LOSS_WARMUP) * z_loss
            return (loss, outputs) if return_outputs else loss

    return AnnealedZLossTrainer


def last_checkpoint(output_dir: str) -> str | None:
    """The job's own "which checkpoint" in auto mode: Transformers' ``get_last_checkpoint``, the
    ``checkpoint-N`` folder with the highest N (None: none yet, a fresh start)."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def last_by_name(output_dir: str) -> str | None:
    """Planted bug: the newest checkpoint taken as the last folder name in sorted order. Right up to step 9;
    from step 10 on ``checkpoint-10`` sorts before ``checkpoint-9`` (and ``checkpoint-2``)."""
    found = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    names = sorted(name for name in found if name.startswith("checkpoint-"))
    return os.path.join(output_dir, names[-1]) if names else None


def checkpoint_to_resume(run: RunContext, latest: Callable[[str], str | None] = last_checkpoint) -> str | None:
    """What the job passes to ``trainer.train(resume_from_checkpoint=...)`` under the run's resume mode:
    ``latest`` of the output directory (``auto``), the folder it was given (``path``), or none (``disabled``)."""
    if run.resume_mode == RESUME_PATH:
        return str(run.resume_path)
    return latest(str(run.checkpoint_dir)) if run.resume_mode == RESUME_AUTO else None


def train(run: RunContext, bug: str | None = None) -> None:
    """The fine-tuning job, driven through :class:`HFTrainerResumeCheck`. Correct when ``bug`` is None."""
    from transformers import Trainer, TrainingArguments, set_seed

    from pytest_resume_check.integrations.hf_trainer import HFTrainerResumeCheck

    p = params(run.case)
    check = HFTrainerResumeCheck(run)  # ids: the "input_id" key that WithIds adds
    set_seed(run.seed)  # before the model: its initial weights come from the global RNG
    model, dataset, collator = model_and_data(p)
    args = TrainingArguments(
        output_dir=str(run.checkpoint_dir),
        use_cpu=True,
        seed=run.seed,
        per_device_train_batch_size=p["batch"],
        gradient_accumulation_steps=p["accum"],
        num_train_epochs=p["epochs"],
        learning_rate=5e-3,
        dataloader_num_workers=p["workers"],
        save_strategy="steps" if p["save_steps"] else "no",  # "no": only the checkpoints HFTrainerResumeCheck asks for
        save_steps=p["save_steps"] or 500,
        save_total_limit=p["keep"] or None,
        remove_unused_columns=False,  # keep "input_id" in the batch; HFTrainerResumeCheck takes it out before the model
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        ignore_data_skip=bug == IGNORE_DATA_SKIP,
        save_only_model=bug == SAVE_ONLY_MODEL,
    )
    trainer_class = annealed_z_loss_trainer() if bug == UNSAVED_ANNEAL else Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=[check])
    resume = checkpoint_to_resume(run, last_by_name if bug == NAME_SORTED else last_checkpoint)
    trainer.train(resume_from_checkpoint=resume)  # check reports the step the Trainer restored


def correct(run: RunContext) -> None:
    """Hugging Face Trainer fine-tuning a tiny GPT-2 through the hf_trainer integration."""
    train(run)


def hf_trainer_ignore_data_skip(run: RunContext) -> None:
    """Planted: ``TrainingArguments(ignore_data_skip=True)``, so a resumed epoch starts over (DUPLICATED)."""
    train(run, IGNORE_DATA_SKIP)


def hf_trainer_save_only_model(run: RunContext) -> None:
    """Planted: ``save_only_model=True``, so a resume restores no optimizer state (STATE_DIVERGED)."""
    train(run, SAVE_ONLY_MODEL)


def hf_trainer_name_sorted_resume(run: RunContext) -> None:
    """Planted: the job resumes from the last folder name in sorted order (checkpoint-9 after checkpoint-10)."""
    train(run, NAME_SORTED)


def hf_trainer_unsaved_anneal(run: RunContext) -> None:
    """Planted: a Trainer subclass anneals a z-loss with a count kept on ``self``, which no checkpoint holds, so
    a resumed run trains on another loss (STATE_DIVERGED, the model first; no framework's finding)."""
    train(run, UNSAVED_ANNEAL)


class _Discard:
    def send(self, event: Any) -> None:
        pass


def warm_up() -> None:
    """Run one tiny fine-tuning (two steps and a checkpoint) in the fork server, so each forked run finds
    transformers, accelerate and torch initialised: the Trainer's first construction and first save are
    the slow ones."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Writing model shards" bars: a tqdm monitor thread must not start here
    with tempfile.TemporaryDirectory() as tmp:
        plan = RunPlan("warm-up", ("", "", ""), {"n": 4, "batch": 2, "epochs": 1}, 0, tmp, os.devnull,
                       resume_mode=RESUME_DISABLED, checkpoint_steps=frozenset({1}))
        train(RunContext(plan, _Discard()))


#: ``transformers.trainer`` is imported here and not first in the warm-up: it imports ``datasets`` and so
#: pyarrow, whose bundled jemalloc starts a background thread, and the fork server refuses warm-ups that
#: start threads. jemalloc's own fork handlers keep a forked child's allocator consistent.
PRELOAD = ("torch", "transformers", "transformers.trainer", "accelerate", "pytest_resume_check.integrations.hf_trainer",
           "pytest_resume_check.builtin.hf_trainer_example:warm_up")

#: The cases that matter for the Trainer, all shuffled by its random sampler over 2 epochs:
#: ``shuffle-save2-keep2``: 12 examples in batches of 4 (3 steps an epoch), the Trainer's own saves every
#: 2 steps besides the harness's, keeping the last 2 (``save_total_limit``).
#: ``accum2-w2``: 6 examples in batches of 2 with 2 accumulation steps (3 batches: 2 optimizer steps an
#: epoch, the second on one batch) and 2 dataloader workers.
#: ``mlm``: masked LM, 8 examples in batches of 4 (2 steps an epoch); the collator masks at random.
CASES = (
    {"id": "shuffle-save2-keep2", "save_steps": 2, "keep": 2},
    {"id": "accum2-w2", "n": 6, "batch": 2, "accum": 2, "workers": 2},
    {"id": MLM_CASE, "n": 8, "mlm": True},
)


def resumes_mid_epoch(cell: Any) -> bool:
    """A cell of the ``mlm`` case in which some run resumes from a checkpoint inside an epoch."""
    per_epoch = steps_per_epoch(cell.case)
    return cell.case.get("id") == MLM_CASE and any(k.checkpoint_step % per_epoch for k in cell.kills)


#: transformers 5.10 restores the RNG state only after it collated the first batches of a resumed epoch
#: (``Trainer._run_epoch``: ``get_batch_samples`` before ``_load_rng_state``), and accelerate's loader has
#: collated one batch ahead: a collator that draws from the global RNG in the main process masks them
#: differently than the uninterrupted run (docs/findings.md; huggingface/transformers#39215).
MLM_MID_EPOCH = ("transformers Trainer: on a mid-epoch resume the RNG state is restored after the first "
                 "batches were collated, so DataCollatorForLanguageModeling masks them differently "
                 "(huggingface/transformers#39215; docs/examples/findings/hf_trainer_rng_after_collate.py)")

#: The file ``Trainer._save_checkpoint`` writes last, which marks a ``checkpoint-N`` folder as complete.
TRAINER_STATE = "trainer_state.json"


def trainer_state_not_durable(cell: Any) -> bool:
    """A crash cell (the default smoke cells of the save of step 2) whose fault leaves the saved
    ``trainer_state.json`` empty: killed after the Trainer opened it and before it closed it, or a power loss
    after it was opened and before it was fsynced."""
    return leaves_incomplete(cell, TRAINER_STATE)


#: transformers 5.10's ``Trainer._save_checkpoint`` writes ``checkpoint-N`` in place (``torch.save(path)``,
#: ``open(path, "w")``) and never fsyncs; ``trainer_state.json``, written last, is all that says a folder is
#: complete. A crash while it is written leaves it empty in a folder an auto resume still takes.
TRAINER_STATE_LOST = ("transformers Trainer: checkpoint-N is written in place and never fsynced; a power loss after "
                      "trainer_state.json was opened leaves it empty in a folder that auto resume still picks, "
                      "and the resume fails on its JSON (a crash smoke cell; docs/crash-consistency.md)")

#: The Hugging Face Trainer (tiny GPT-2) through the hf_trainer integration.
hf_trainer_example = resume_target(
    correct,
    name="hf_trainer_example",
    steps=total_steps,
    boundaries=epoch_boundaries,
    cases=CASES,
    contract="exactly_once_ordered",
    preload=PRELOAD,
    expected_failures=[(resumes_mid_epoch, MLM_MID_EPOCH), (trainer_state_not_durable, TRAINER_STATE_LOST)],
)


def _has_transformers() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "accelerate"))


#: Only offered where torch, transformers and accelerate are installed.
TARGETS = [hf_trainer_example] if _has_transformers() else []
