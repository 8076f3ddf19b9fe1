"""Peak memory of fine-tuning under whatever the launch selects (DDP, FSDP, DeepSpeed ZeRO stages): Accelerate's
backend suites launch this file as ``test_peak_memory_usage.py`` with ``--peak_memory_upper_bound`` (MiB).

Each epoch trains a sequence classifier on the first ``--n_train`` samples of GLUE MRPC and measures, on every
process, the peak memory of the epoch: on an accelerator (CUDA, XPU, ...) its allocator's peak since the epoch
began plus what was allocated before (``torch.accelerator``); on the CPU the process's peak resident set size
(``getrusage``; it counts the whole process, torch's own libraries included, and cannot be reset, so it is the
peak since the start). An epoch over the bound fails. The peaks (MiB) go to
``<output_dir>/peak_memory_utilization.json``. Gradient accumulation follows the DeepSpeed config's
``gradient_accumulation_steps``, by hand, as the reference's script does.

Offline: ``--model_name_or_path <local dir> --dataset_dir <dir with train.jsonl, validation.jsonl>``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource

import torch

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.test_utils.scripts.external_deps.mrpc import (
    accumulation_steps,
    add_model_and_data_arguments,
    mrpc_loaders,
    optimizer_and_schedule,
    train_epoch_by_hand,
)

MIB = 2**20


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.begin_mib``, ``peak.used_mib`` (end - begin) and
    ``peak.total_mib`` (the peak, in MiB)."""

    def __init__(self, device: torch.device):
        self.on_accelerator = device.type != "cpu"
        # torch.accelerator has the memory counters from torch 2.9; before, the device's own module does
        self.memory = torch.accelerator if hasattr(torch.accelerator, "max_memory_allocated") else getattr(
            torch, device.type)

    def _allocated(self) -> int:
        return self.memory.memory_allocated() if self.on_accelerator else _resident_peak()

    def __enter__(self):
        gc.collect()
        if self.on_accelerator:
            self.memory.empty_cache()
            self.memory.reset_peak_memory_stats()
        self.begin = self._allocated()
        return self

    def __exit__(self, *exc):
        gc.collect()
        if self.on_accelerator:
            self.memory.empty_cache()
            self.end, self.peak = self.memory.memory_allocated(), self.memory.max_memory_allocated()
        else:
            self.end = self.peak = _resident_peak()
        self.begin_mib = int(self.begin / MIB)
        self.used_mib = int((self.end - self.begin) / MIB)
        self.total_mib = int(self.peak / MIB)
        return False


def _resident_peak() -> int:
    """The process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def train(args) -> None:
    accelerator = Accelerator()
    set_seed(args.seed)
    train_loader, _ = mrpc_loaders(args.model_name_or_path, args.batch_size, dataset_dir=args.dataset_dir,
                                   n_train=args.n_train, n_val=args.n_val)

    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, return_dict=True)
    every = accumulation_steps(accelerator)
    total_steps = (len(train_loader) * args.num_epochs) // every
    optimizer, schedule, _ = optimizer_and_schedule(accelerator, model, args.lr, total_steps)
    model, optimizer, train_loader, schedule = accelerator.prepare(model, optimizer, train_loader, schedule)

    peaks = {}
    for epoch in range(args.num_epochs):
        with PeakMemory(accelerator.device) as peak:
            train_epoch_by_hand(accelerator, model, optimizer, schedule, train_loader, every)
        accelerator.print(f"Memory before entering the train : {peak.begin_mib}")
        accelerator.print(f"Memory consumed at the end of the train (end-begin): {peak.used_mib}")
        accelerator.print(f"Total Peak Memory consumed during the train (max): {peak.total_mib}")
        peaks[f"epoch-{epoch}"] = peak.total_mib
        if args.peak_memory_upper_bound is not None:
            assert peak.total_mib <= args.peak_memory_upper_bound, (
                f"Peak memory usage exceeded the upper bound: {peak.total_mib} MiB > {args.peak_memory_upper_bound}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(args.output_dir, "peak_memory_utilization.json"), "w") as handle:
            json.dump(peaks, handle)
    accelerator.end_training()


def parse(argv=None):
    parser = argparse.ArgumentParser(description="Peak memory of fine-tuning on GLUE MRPC.")
    add_model_and_data_arguments(parser)
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--peak_memory_upper_bound", type=float, default=None,
                        help="Fail when an epoch's peak memory (MiB) exceeds this.")
    parser.add_argument("--n_train", type=int, default=320)
    parser.add_argument("--n_val", type=int, default=160)
    parser.add_argument("--num_epochs", type=int, default=1)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    train(parse(argv))


if __name__ == "__main__":
    main()
