"""Save each epoch's state, then resume from one and check the resumed run is where the first one was: Accelerate's
backend suites launch this file as ``test_checkpointing.py`` (once with ``--partial_train_epoch``, then again with
``--resume_from_checkpoint <output_dir>/epoch_<k>``).

The first run fine-tunes a sequence classifier on GLUE MRPC and, after each epoch ``k``, writes
``save_state(<output_dir>/epoch_k)`` and ``<output_dir>/state_k.json`` (validation accuracy, the scheduler's and the
optimizer's learning rates, the epoch, the step). The resumed run loads the state and must find the same accuracy,
learning rates and epoch, exactly. Gradient accumulation follows the DeepSpeed config's
``gradient_accumulation_steps``, by hand, as the reference's script does.

Offline: ``--model_name_or_path <local dir> --dataset_dir <dir with train.jsonl, validation.jsonl>``.
"""
from __future__ import annotations

import argparse
import json
import os
import re

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.test_utils.scripts.external_deps.mrpc import (
    accumulation_steps,
    accuracy,
    add_model_and_data_arguments,
    mrpc_loaders,
    optimizer_and_schedule,
    train_epoch_by_hand,
)


def epoch_of(checkpoint: str) -> int:
    """The epoch a checkpoint folder is named after (``.../epoch_3`` -> 3)."""
    found = re.search(r"epoch_(\d+)", os.path.basename(os.path.normpath(checkpoint)))
    if found is None:
        raise ValueError(f"--resume_from_checkpoint {checkpoint!r} is not named epoch_<number>")
    return int(found.group(1))


def train(args) -> None:
    accelerator = Accelerator()
    set_seed(args.seed)
    train_loader, eval_loader = mrpc_loaders(args.model_name_or_path, args.batch_size, dataset_dir=args.dataset_dir)

    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, return_dict=True)
    every = accumulation_steps(accelerator)
    total_steps = (len(train_loader) * args.num_epochs) // every
    optimizer, schedule, _ = optimizer_and_schedule(accelerator, model, args.lr, total_steps)
    model, optimizer, train_loader, eval_loader, schedule = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, schedule)

    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        epoch = epoch_of(args.resume_from_checkpoint)
        (resumed_accuracy,) = accuracy(accelerator, model, eval_loader)
        accelerator.print("resumed checkpoint performance:", resumed_accuracy)
        with open(os.path.join(args.output_dir, f"state_{epoch}.json")) as handle:
            saved = json.load(handle)
        assert saved["accuracy"] == resumed_accuracy, "Accuracy mismatch, loading from checkpoint failed"
        assert saved["lr"] == schedule.get_lr()[0], "Scheduler learning rate mismatch, loading from checkpoint failed"
        assert saved["optimizer_lr"] == optimizer.param_groups[0]["lr"], (
            "Optimizer learning rate mismatch, loading from checkpoint failed")
        assert saved["epoch"] == epoch, "Epoch mismatch, loading from checkpoint failed"
        accelerator.end_training()
        return

    last_epoch = args.partial_train_epoch if args.partial_train_epoch is not None else args.num_epochs
    step = 0
    for epoch in range(last_epoch):
        step += train_epoch_by_hand(accelerator, model, optimizer, schedule, train_loader, every)
        accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))
        (epoch_accuracy,) = accuracy(accelerator, model, eval_loader)
        state = {"accuracy": epoch_accuracy, "lr": schedule.get_lr()[0],
                 "optimizer_lr": optimizer.param_groups[0]["lr"], "epoch": epoch, "step": step}
        accelerator.print(f"epoch {epoch}:", state)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            with open(os.path.join(args.output_dir, f"state_{epoch}.json"), "w") as handle:
                json.dump(state, handle)
    accelerator.end_training()


def parse(argv=None):
    parser = argparse.ArgumentParser(description="Save each epoch's state on GLUE MRPC, or resume and compare.")
    add_model_and_data_arguments(parser)
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None,
                        help="A folder <output_dir>/epoch_<k> written by an earlier run of this script.")
    parser.add_argument("--partial_train_epoch", type=int, default=None, help="Stop after this many epochs.")
    parser.add_argument("--num_epochs", type=int, default=2)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    train(parse(argv))


if __name__ == "__main__":
    main()
