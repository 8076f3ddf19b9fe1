"""A tiny regression problem for tests and examples (Accelerate's ``accelerate.test_utils.training``).

``RegressionDataset`` draws ``y = a * x + b`` plus a little noise; ``RegressionModel`` learns ``a`` and ``b``.
Training one on the other converges in a few steps on any device and any number of processes, which makes
them the usual fixtures for checking data loading, accumulation, mixed precision and checkpointing.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["RegressionDataset", "RegressionModel", "mocked_dataloaders",
           "mocked_dataloaders_for_autoregressive_models"]


class RegressionDataset:
    """``length`` samples ``{"x": x, "y": a * x + b + noise}``, float32, with ``x ~ N(0, 1)`` and ``noise ~ N(0, 0.1)``.

    ``seed`` makes the data reproducible (``numpy.random.default_rng(seed)``: the same seed gives the same
    samples as Accelerate's class); ``None`` draws fresh data. ``x`` and ``y`` are the whole columns.
    """

    def __init__(self, a=2, b=3, length=64, seed=None):
        generator = np.random.default_rng(seed)
        self.length = length
        self.x = generator.normal(size=(length,)).astype(np.float32)
        noise = generator.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = a * self.x + b + noise

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """``forward(x) = x * a + b`` with two scalar parameters ``a`` and ``b`` (float32, initialised from the
    arguments). On its first call it prints the parameters' and the input's dtypes (what mixed-precision tests
    look at); ``first_batch`` turns to False afterwards. ``double_output`` is accepted for compatibility and has
    no effect."""

    def __init__(self, a=0, b=0, double_output=False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x=None):
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


_MRPC_FILES = {"train": "tests/test_samples/MRPC/train.csv", "validation": "tests/test_samples/MRPC/dev.csv"}


def _hf_suite(feature: str):
    """``(datasets.load_dataset, transformers.AutoTokenizer)``, or ImportError naming what to install."""
    from ..core.imports import require_extra

    datasets = require_extra("datasets", feature)
    transformers = require_extra("transformers", feature)
    return datasets.load_dataset, transformers.AutoTokenizer


def _is_xla(accelerator) -> bool:
    return str(getattr(accelerator, "distributed_type", "")) == "XLA"


def mocked_dataloaders(accelerator, batch_size: int = 16):
    """Train and validation loaders over the small MRPC sample (sentence pairs, ``labels``), tokenized with
    ``bert-base-cased``: the stand-in Accelerate's example scripts use in tests.

    Reads ``tests/test_samples/MRPC/{train,dev}.csv`` relative to the current folder and needs 🤗 Datasets and
    Transformers (and the tokenizer, from the Hub or its cache). Batches of 2 (train, shuffled) and 1
    (validation), as in the reference; ``batch_size`` is accepted and unused there too.
    """
    load_dataset, auto_tokenizer = _hf_suite("mocked_dataloaders")
    tokenizer = auto_tokenizer.from_pretrained("bert-base-cased")
    raw = load_dataset("csv", data_files=_MRPC_FILES)
    label_ids = {label: i for i, label in enumerate(raw["train"].unique("label"))}

    def tokenize(examples):
        encoded = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None,
                            padding="max_length")
        if "label" in examples:
            encoded["labels"] = [label_ids[label] for label in examples["label"]]
        return encoded

    tokenized = raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(examples):
        if _is_xla(accelerator):  # fixed shapes: no recompilation per batch on TPU
            return tokenizer.pad(examples, padding="max_length", max_length=128, return_tensors="pt")
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    train = torch.utils.data.DataLoader(tokenized["train"], shuffle=True, collate_fn=collate, batch_size=2)
    evaluation = torch.utils.data.DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate,
                                             batch_size=1)
    return train, evaluation


def mocked_dataloaders_for_autoregressive_models(accelerator, batch_size: int = 16):
    """Train and validation loaders for a causal language model over the MRPC sample's first sentences,
    tokenized with ``HuggingFaceTB/SmolLM-360M``: ``input_ids`` and ``labels`` shifted by one token, padding
    labelled -100, padded to a multiple of 8 (16 under fp8) when ``accelerator`` uses mixed precision.

    Needs the same files and packages as ``mocked_dataloaders``.
    """
    load_dataset, auto_tokenizer = _hf_suite("mocked_dataloaders_for_autoregressive_models")
    tokenizer = auto_tokenizer.from_pretrained("HuggingFaceTB/SmolLM-360M")
    tokenizer.pad_token = tokenizer.eos_token
    raw = load_dataset("csv", data_files=_MRPC_FILES)

    def tokenize(examples):
        return tokenizer(examples["sentence1"], truncation=True, max_length=None, return_attention_mask=False)

    with accelerator.main_process_first():
        tokenized = raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(examples):
        longest = 128 if _is_xla(accelerator) else max(len(example["input_ids"]) for example in examples)
        precision = str(getattr(accelerator, "mixed_precision", "no"))
        multiple = 16 if precision == "fp8" else (8 if precision != "no" else None)
        batch = tokenizer.pad(examples, padding="max_length", max_length=longest + 1, pad_to_multiple_of=multiple,
                              return_tensors="pt")
        batch["labels"] = batch["input_ids"][:, 1:]
        batch["input_ids"] = batch["input_ids"][:, :-1]
        if "attention_mask" in batch:
            batch["attention_mask"] = batch["attention_mask"][:, :-1]
        batch["labels"] = torch.where(batch["labels"] == tokenizer.pad_token_id, -100, batch["labels"])
        return batch

    train = torch.utils.data.DataLoader(tokenized["train"], shuffle=False, collate_fn=collate, batch_size=2)
    evaluation = torch.utils.data.DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate,
                                             batch_size=1)
    return train, evaluation
