"""What the MRPC scripts of this folder share: sentence-pair loaders tokenized by the model's tokenizer, accuracy
over the whole validation split gathered from every process, and the optimizer and schedule a DeepSpeed config may
name.

The data is GLUE MRPC from the Hub (``nyu-mll/glue``), or ``train.jsonl`` / ``validation.jsonl`` of a local
``--dataset_dir`` (same columns) for runs without network.
"""
from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader

EVAL_BATCH_SIZE = 32


def add_model_and_data_arguments(parser: argparse.ArgumentParser, model: str = "bert-base-cased",
                                 batch_size: int = 16) -> None:
    """The options every MRPC script takes: the model (a Hub id or a local directory), hasten's own local copy of
    the data, and the learning rate, batch size and seed (the reference's values by default)."""
    parser.add_argument("--model_name_or_path", type=str, default=model,
                        help="A model id on the Hugging Face Hub or a local directory saved by save_pretrained.")
    parser.add_argument("--dataset_dir", type=str, default=None,
                        help="A folder with train.jsonl and validation.jsonl (sentence1, sentence2, label) read "
                             "instead of GLUE MRPC from the Hub.")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--seed", type=int, default=42)


def load_mrpc(dataset_dir: str | None):
    """The train and validation splits: from ``dataset_dir`` when given, else GLUE MRPC from the Hub."""
    from datasets import load_dataset

    if dataset_dir is None:
        return load_dataset("nyu-mll/glue", "mrpc")
    files = {split: os.path.join(dataset_dir, f"{split}.jsonl") for split in ("train", "validation")}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(f"--dataset_dir {dataset_dir!r} lacks {', '.join(missing)}")
    return load_dataset("json", data_files=files)


def mrpc_loaders(model_name: str, batch_size: int = 16, eval_batch_size: int = EVAL_BATCH_SIZE,
                 dataset_dir: str | None = None, n_train: int | None = None, n_val: int | None = None):
    """Shuffled training and ordered validation loaders of tokenized sentence pairs, padded per batch to the
    longest; ``n_train`` / ``n_val`` keep the first samples of each split."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    data = load_mrpc(dataset_dir)
    if n_train is not None:
        data["train"] = data["train"].select(range(min(n_train, len(data["train"]))))
    if n_val is not None:
        data["validation"] = data["validation"].select(range(min(n_val, len(data["validation"]))))
    text_columns = [name for name in ("idx", "sentence1", "sentence2") if name in data["train"].column_names]

    def tokenize(rows):
        return tokenizer(rows["sentence1"], rows["sentence2"], truncation=True, max_length=None)

    tokenized = data.map(tokenize, batched=True, remove_columns=text_columns, load_from_cache_file=False)
    tokenized = tokenized.rename_column("label", "labels")

    def collate(rows):
        return tokenizer.pad(rows, padding="longest", return_tensors="pt")

    train = DataLoader(tokenized["train"], shuffle=True, collate_fn=collate, batch_size=batch_size)
    validation = DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=eval_batch_size)
    return train, validation


def accuracy(accelerator, model, eval_loader, *more_models) -> list:
    """The share of validation samples each model classifies right, counted once each over every process
    (``gather_for_metrics`` drops the samples the last batches repeat to even the processes out)."""
    models = (model, *more_models)
    correct = [0] * len(models)
    seen = 0
    for candidate in models:
        candidate.eval()
    for batch in eval_loader:
        batch = batch.to(accelerator.device)
        with torch.no_grad():
            predictions = [candidate(**batch).logits.argmax(dim=-1) for candidate in models]
        *predictions, labels = accelerator.gather_for_metrics((*predictions, batch["labels"]))
        for i, predicted in enumerate(predictions):
            correct[i] += int((predicted == labels).sum())
        seen += labels.numel()
    return [right / max(seen, 1) for right in correct]


def deepspeed_config(accelerator) -> dict:
    """The active DeepSpeed config, or an empty one when DeepSpeed does not run."""
    plugin = accelerator.state.deepspeed_plugin
    return plugin.deepspeed_config if plugin is not None else {}


def optimizer_and_schedule(accelerator, model, lr: float, total_steps: int):
    """AdamW and a linear decay to 0 over ``total_steps`` without warm-up, or DeepSpeed's own optimizer and
    schedule (``DummyOptim`` / ``DummyScheduler``) where the DeepSpeed config names them. Returns
    ``(optimizer, scheduler, decays_linearly)``."""
    from transformers import get_linear_schedule_with_warmup

    from hasten.strategies.deepspeed.wrappers import DummyOptim, DummyScheduler

    config = deepspeed_config(accelerator)
    optimizer_class = DummyOptim if "optimizer" in config else torch.optim.AdamW
    optimizer = optimizer_class(params=model.parameters(), lr=lr)
    if "scheduler" in config:
        return optimizer, DummyScheduler(optimizer, total_num_steps=total_steps, warmup_num_steps=0), False
    schedule = get_linear_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=0, num_training_steps=total_steps)
    return optimizer, schedule, True


def accumulation_steps(accelerator) -> int:
    """The DeepSpeed config's ``gradient_accumulation_steps`` (the scripts accumulate by hand), else 1."""
    steps = deepspeed_config(accelerator).get("gradient_accumulation_steps", 1)
    return steps if isinstance(steps, int) and steps > 0 else 1


def train_epoch_by_hand(accelerator, model, optimizer, schedule, loader, every: int) -> int:
    """One epoch the way the reference's checkpointing and memory scripts train: the loss divided by ``every``,
    the optimizer and scheduler stepped on every ``every``-th batch (the first included), no ``accumulate``.
    Returns the batches seen."""
    model.train()
    seen = 0
    for index, batch in enumerate(loader):
        accelerator.backward(model(**batch).loss / every)
        if index % every == 0:
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        seen += 1
    return seen
