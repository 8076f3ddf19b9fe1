"""transformers' DeepSpeed ZeRO-3 integration after the script set up torch.distributed itself: Accelerate's
DeepSpeed suite launches this file (``test_zero3_integration.py``) on two processes.

The script initialises the default process group (NCCL on CUDA, gloo otherwise), builds ``TrainingArguments``
with a ZeRO-3 config (which makes transformers select DeepSpeed for the run) and loads a model, which transformers
then partitions under ``deepspeed.zero.Init``. It passes when both succeed on every process. transformers must
reach hasten as ``accelerate`` (``HASTEN_AS_ACCELERATE=1``) or find Accelerate itself.

Offline: ``--model_name_or_path <local dir>`` (default ``sshleifer/tiny-gpt2`` from the Hub).
"""
from __future__ import annotations

import argparse
import tempfile

import torch
import torch.distributed as dist

ZERO3 = {"zero_optimization": {"stage": 3}, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="TrainingArguments with ZeRO-3 after init_process_group.")
    parser.add_argument("--model_name_or_path", type=str, default="sshleifer/tiny-gpt2")
    args = parser.parse_args(argv)

    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    from transformers import AutoModel, TrainingArguments
    from transformers.integrations import is_deepspeed_zero3_enabled

    with tempfile.TemporaryDirectory() as output_dir:
        arguments = TrainingArguments(output_dir=output_dir, deepspeed=ZERO3, report_to=[])
        assert arguments is not None
        assert is_deepspeed_zero3_enabled(), "TrainingArguments(deepspeed=<ZeRO-3 config>) did not select ZeRO-3"
        model = AutoModel.from_pretrained(args.model_name_or_path)
        assert model is not None
        partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
        assert partitioned, "the model was not partitioned by deepspeed.zero.Init"
    dist.barrier()
    if dist.get_rank() == 0:
        print("ZERO3 INTEGRATION PASSED")


if __name__ == "__main__":
    main()
