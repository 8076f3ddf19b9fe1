"""``gather_for_metrics`` counts every evaluation sample exactly once, on any number of processes (Accelerate's
metrics suite runs this file's ``main`` through ``debug_launcher`` and launches the file on GPUs:
``test_utils/scripts/external_deps/test_metrics.py``).

Checked, for every ``split_batches`` x ``dispatch_batches``:

- a regression model's outputs over 99 samples gathered with their targets: exactly 99 rows (the samples
  ``even_batches`` repeats on the last batches are dropped); 512 samples, which divide evenly, lose none;
- a loader with ``drop_last=True``: a full batch from every process (nothing is dropped twice);
- loaders on iterable data sets (of tensors and of plain ints, which a ``DataLoaderDispatcher`` reads on the main
  process): all 30 items come back, and hasten logs no warning about them;
- on an accelerator (or with ``--mrpc`` on CPU): a BERT sequence classifier's accuracy and F1 over GLUE MRPC's
  validation split, computed from gathered predictions, equal the single-process evaluation's.

The MRPC model is ``hf-internal-testing/mrpc-bert-base-cased`` (the Hub), or ``--model_name_or_path`` with
``--dataset_dir`` offline (see ``mrpc.py``). Run: ``hasten launch -n 2 <this file>``, or call ``main()`` (the
defaults) directly or through ``debug_launcher``.
"""
from __future__ import annotations

import argparse
import logging
import math
from copy import deepcopy

import torch
from torch.utils.data import DataLoader, IterableDataset

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.config.data import DataLoaderConfiguration
from hasten.data.dispatcher import DataLoaderDispatcher
from hasten.state import AcceleratorState
from hasten.test_utils.scripts.external_deps.mrpc import (
    add_model_and_data_arguments,
    load_mrpc,
)
from hasten.test_utils.training import RegressionDataset, RegressionModel

MRPC_MODEL = "hf-internal-testing/mrpc-bert-base-cased"
LOADER_SETTINGS = [(split, dispatch) for split in (True, False) for dispatch in (True, False)]


class Items(IterableDataset):
    """An iterable data set that also has a length (which hasten must not mistake for a map-style one)."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        yield from self.items


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def fresh_accelerator(split_batches=False, dispatch_batches=None) -> Accelerator:
    if AcceleratorState._shared_state:
        AcceleratorState._reset_state()
    return Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split_batches,
                                                                 dispatch_batches=dispatch_batches))


def check_regression_outputs(accelerator: Accelerator, num_samples: int, batch_size: int = 16) -> None:
    set_seed(42)
    model = accelerator.prepare(RegressionModel())
    loader = accelerator.prepare(DataLoader(RegressionDataset(length=num_samples), batch_size=batch_size))
    outputs, targets = [], []
    for batch in loader:
        with torch.no_grad():
            output = model(batch["x"])
        output, target = accelerator.gather_for_metrics((output, batch["y"]))
        outputs.append(output)
        targets.append(target)
    outputs, targets = torch.cat(outputs), torch.cat(targets)
    assert len(outputs) == len(targets) == num_samples, (
        f"gathered {len(outputs)} outputs and {len(targets)} targets for {num_samples} samples")


def check_drop_last() -> None:
    accelerator = fresh_accelerator()
    per_process = 5
    loader = accelerator.prepare(DataLoader(range(10 * accelerator.num_processes + 1), batch_size=per_process,
                                            drop_last=True))
    batches = iter(loader)
    next(batches)
    gathered = accelerator.gather_for_metrics(next(batches))
    assert gathered.size(0) == per_process * accelerator.num_processes, (
        f"gathered {gathered.size(0)} items of a full batch on each of {accelerator.num_processes} processes")


def check_iterable(items, dispatched: bool) -> None:
    accelerator = fresh_accelerator()
    loader = accelerator.prepare(DataLoader(Items(items), batch_size=4))
    if dispatched:  # batches of tensors: read on the main process and sent out
        assert isinstance(loader, DataLoaderDispatcher), type(loader)
    records = Records()
    logging.getLogger("hasten").addHandler(records)
    try:
        gathered = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader])
    finally:
        logging.getLogger("hasten").removeHandler(records)
    assert gathered.size(0) == len(items), f"gathered {gathered.size(0)} of {len(items)} items"
    assert not records.records, [record.getMessage() for record in records.records]


def accuracy_and_f1(predictions: torch.Tensor, labels: torch.Tensor) -> dict:
    true_positive = int(((predictions == 1) & (labels == 1)).sum())
    predicted, actual = int((predictions == 1).sum()), int((labels == 1).sum())
    f1 = 2 * true_positive / (predicted + actual) if predicted + actual else 0.0
    return {"accuracy": float((predictions == labels).float().mean()), "f1": f1, "count": labels.numel()}


def mrpc_validation_loader(tokenizer, dataset_dir, dispatch_batches: bool, max_length: int = 128) -> DataLoader:
    """GLUE MRPC's validation split, in order; padded to ``max_length`` tokens when batches are dispatched (the main
    process concatenates the processes' batches), else to each batch's longest."""
    validation = load_mrpc(dataset_dir)["validation"]
    columns = [name for name in ("idx", "sentence1", "sentence2") if name in validation.column_names]
    tokenized = validation.map(lambda rows: tokenizer(rows["sentence1"], rows["sentence2"], truncation=True),
                               batched=True, remove_columns=columns, load_from_cache_file=False)
    tokenized = tokenized.rename_column("label", "labels")

    def collate(rows):
        if dispatch_batches:
            return tokenizer.pad(rows, padding="max_length", max_length=max_length, return_tensors="pt")
        return tokenizer.pad(rows, padding="longest", return_tensors="pt")

    return DataLoader(tokenized, shuffle=False, collate_fn=collate, batch_size=16)


def check_mrpc(options, split_batches: bool, dispatch_batches: bool) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    accelerator = fresh_accelerator(split_batches, dispatch_batches)
    tokenizer = AutoTokenizer.from_pretrained(options.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(options.model_name_or_path).to(accelerator.device)
    max_length = min(128, getattr(model.config, "max_position_embeddings", 128))
    with accelerator.main_process_first():
        loader = mrpc_validation_loader(tokenizer, options.dataset_dir, dispatch_batches, max_length)
    model.eval()

    predictions, labels = [], []
    for batch in loader:  # one process, the whole split: the baseline
        batch = batch.to(accelerator.device)
        with torch.inference_mode():
            predictions.append(model(**batch).logits.argmax(dim=-1))
        labels.append(batch["labels"])
    baseline = accuracy_and_f1(torch.cat(predictions), torch.cat(labels))

    prepared_model, prepared_loader = accelerator.prepare(deepcopy(model), loader)
    prepared_model.eval()
    predictions, labels = [], []
    for batch in prepared_loader:
        with torch.inference_mode():
            predicted = prepared_model(**batch).logits.argmax(dim=-1)
        predicted, label = accelerator.gather_for_metrics((predicted, batch["labels"]))
        predictions.append(predicted)
        labels.append(label)
    distributed = accuracy_and_f1(torch.cat(predictions), torch.cat(labels))
    assert distributed["count"] == baseline["count"], (distributed, baseline)
    for key in ("accuracy", "f1"):
        assert math.isclose(baseline[key], distributed[key]), (
            f"split_batches={split_batches}, dispatch_batches={dispatch_batches}: {key} {distributed[key]} "
            f"gathered, {baseline[key]} on one process")


def main(options: argparse.Namespace | None = None) -> None:
    options = options or parse_arguments([])
    accelerator = fresh_accelerator()
    if options.mrpc or accelerator.device.type != "cpu":
        for split_batches, dispatch_batches in LOADER_SETTINGS:
            accelerator.print(f"MRPC, split_batches={split_batches}, dispatch_batches={dispatch_batches}")
            check_mrpc(options, split_batches, dispatch_batches)
    for split_batches, dispatch_batches in LOADER_SETTINGS:
        accelerator.print(f"99 samples, split_batches={split_batches}, dispatch_batches={dispatch_batches}")
        check_regression_outputs(fresh_accelerator(split_batches, dispatch_batches), 99)
    accelerator.print("512 samples, which divide evenly")
    check_regression_outputs(fresh_accelerator(), 512)
    accelerator.print("drop_last")
    check_drop_last()
    accelerator.print("iterable data sets")
    check_iterable(torch.arange(30), dispatched=True)
    check_iterable(list(range(30)), dispatched=False)
    accelerator = fresh_accelerator()
    accelerator.print("METRICS PASSED")
    accelerator.end_training()
    AcceleratorState._reset_state()


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="gather_for_metrics counts every sample once.")
    add_model_and_data_arguments(parser, model=MRPC_MODEL)
    parser.add_argument("--mrpc", action="store_true", help="Check the MRPC model on CPU too (slower).")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_arguments())
