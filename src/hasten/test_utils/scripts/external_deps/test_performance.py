"""Fine-tune a sequence classifier on GLUE MRPC under whatever the launch selects (DDP, FSDP, DeepSpeed, tensor
parallelism) and check that it learns: Accelerate's backend suites launch this file as ``test_performance.py``.

Checks, on every process: with full precision and a linear schedule (transformers' ``get_linear_schedule_with_warmup``,
when the DeepSpeed config names no scheduler), the learning rate after the first
optimizer step is ``lr * (1 - 1 / steps per data-parallel process)`` and 0 after the last (the schedule was written
for the whole data set, and the prepared scheduler advances once per data-parallel process at each step: once per
process, except under tensor parallelism, where the ranks of a tensor-parallel group share their batches and
Accelerate's schedule would run that many times too fast); the best validation accuracy reaches
``--performance_lower_bound`` when given; ``save_model`` writes ``model.safetensors`` into ``--output_dir``
(except under a transformers tensor-parallel plan). The accuracy of each epoch goes to
``<output_dir>/all_results.json``.

Offline: ``--model_name_or_path <local dir> --dataset_dir <dir with train.jsonl, validation.jsonl>``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.parallel.config import ParallelismConfig
from hasten.test_utils.scripts.external_deps.mrpc import (
    accuracy,
    add_model_and_data_arguments,
    mrpc_loaders,
    optimizer_and_schedule,
)

SAFE_WEIGHTS_NAME = "model.safetensors"


def train(args) -> None:
    options = {"parallelism_config": ParallelismConfig(tp_size=args.tp_size)} if args.tp_size is not None else {}
    accelerator = Accelerator(**options)
    set_seed(args.seed)
    train_loader, eval_loader = mrpc_loaders(args.model_name_or_path, args.batch_size, dataset_dir=args.dataset_dir)

    from transformers import AutoModelForSequenceClassification

    model_options = {}
    if args.tp_plan is not None:
        model_options["tp_plan"] = args.tp_plan
    if args.tp_size is not None:
        model_options["tp_size"] = args.tp_size
    if args.model_dtype is not None:
        import transformers
        from packaging.version import Version

        # transformers 4.56 renamed torch_dtype to dtype
        dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        model_options[dtype_key] = getattr(torch, args.model_dtype)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, return_dict=True,
                                                               **model_options)
    if args.add_pad_token and model.config.pad_token_id is None:
        model.config.pad_token_id = 0

    total_steps = len(train_loader) * args.num_epochs
    optimizer, schedule, decays_linearly = optimizer_and_schedule(accelerator, model, args.lr, total_steps)
    model, optimizer, train_loader, eval_loader, schedule = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, schedule)

    check_lr = decays_linearly and accelerator.state.mixed_precision == "no"
    # the processes that each read their own batches: the prepared scheduler advances that many steps per step
    readers = getattr(schedule, "data_parallel_size", None) or accelerator.num_processes
    steps_per_reader = total_steps / readers / accelerator.gradient_accumulation_steps
    expected_first_lr = args.lr * (1 - 1 / steps_per_reader)
    first_lr_checked = False
    step_context = contextlib.nullcontext
    if args.tp_plan is not None:
        from torch.distributed.tensor.experimental import implicit_replication

        step_context = implicit_replication
    results, best = {}, 0.0
    for epoch in range(args.num_epochs):
        model.train()
        for batch in train_loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                with step_context():
                    optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                if check_lr and accelerator.sync_gradients and not first_lr_checked:
                    got = schedule.get_last_lr()[0]
                    assert got == expected_first_lr, (
                        f"Wrong lr found at second step, expected {expected_first_lr}, got {got}")
                    first_lr_checked = True
        (epoch_accuracy,) = accuracy(accelerator, model, eval_loader)
        accelerator.print(f"epoch {epoch}: accuracy {epoch_accuracy}")
        results[f"epoch-{epoch}"] = epoch_accuracy
        best = max(best, epoch_accuracy)

    if check_lr:
        last = schedule.get_last_lr()[0]
        assert last == 0, f"Wrong lr found at last step, expected 0, got {last}"
    if args.performance_lower_bound is not None:
        assert args.performance_lower_bound <= best, (
            f"Best performance metric {best} is lower than the lower bound {args.performance_lower_bound}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(args.output_dir, "all_results.json"), "w") as handle:
            json.dump(results, handle)
    if args.tp_plan is None:
        accelerator.save_model(model, args.output_dir)
        accelerator.wait_for_everyone()
        assert os.path.exists(os.path.join(args.output_dir, SAFE_WEIGHTS_NAME)), (
            "Model was not saved when calling `Accelerator.save_model`")
    accelerator.end_training()


def parse(argv=None):
    parser = argparse.ArgumentParser(description="Fine-tune on GLUE MRPC and check the accuracy reached.")
    add_model_and_data_arguments(parser)
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--performance_lower_bound", type=float, default=None,
                        help="Fail when the best validation accuracy stays below this.")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--add_pad_token", type=bool, default=False,
                        help="Set the model's pad_token_id to 0 when it has none.")
    parser.add_argument("--tp_plan", type=str, default=None, help="'auto': transformers' tensor-parallel plan.")
    parser.add_argument("--tp_size", type=int, default=None, help="Tensor-parallel size.")
    parser.add_argument("--model_dtype", type=str, default=None, choices=["bfloat16", "float16", "float32"],
                        help="Load the model in this dtype (default: the checkpoint's).")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    train(parse(argv))


if __name__ == "__main__":
    main()
