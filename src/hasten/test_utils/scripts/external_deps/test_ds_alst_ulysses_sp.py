"""DeepSpeed sequence parallelism (ALST / Ulysses) training a causal language model: Accelerate's DeepSpeed suite
launches this file (``test_ds_alst_ulysses_sp.py``) on two processes with ``--use_deepspeed --zero_stage=2|3``.

``ParallelismConfig(sp_backend="deepspeed", sp_size=2)`` with a ``DeepSpeedSequenceParallelConfig`` (sdpa
attention, variable sequence lengths); ``prepare`` wraps the loader in DeepSpeed's Ulysses adapter, so each rank
gets its half of every sequence with its labels as ``shift_labels``. Each step computes the rank's shard loss,
aggregates it over the sequence-parallel group as the reference documents (each shard's loss weighted by its
counted tokens, through a differentiable all_gather), and steps. Checks: the adapter halves the sequences, every
aggregated loss is finite and the same on both ranks.

Offline: ``--model_name_or_path <local dir>`` (default ``hf-internal-testing/tiny-random-LlamaForCausalLM`` from
the Hub).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.parallel.config import DeepSpeedSequenceParallelConfig, ParallelismConfig

SP_SIZE, SAMPLES, SEQ_LEN = 2, 4, 32


def one_sample_per_batch(rows):
    """A batch of one sequence, its positions and its labels (the tokens themselves)."""
    ids, positions = rows[0]
    return {"input_ids": ids.unsqueeze(0), "position_ids": positions.unsqueeze(0), "labels": ids.unsqueeze(0)}


def aggregated_loss(shard_loss, shift_labels, group, size):
    """The sequence's mean loss from every rank's shard mean, weighted by the tokens each shard counts."""
    losses = torch.distributed.nn.functional.all_gather(shard_loss, group=group)
    counted = (shift_labels != -100).view(-1).sum()
    counts = torch.distributed.nn.functional.all_gather(counted, group=group)
    total = sum(losses[rank] * counts[rank] for rank in range(size) if counts[rank] > 0)
    return total / max(sum(counts), 1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="ALST / Ulysses sequence parallelism under DeepSpeed.")
    parser.add_argument("--model_name_or_path", type=str, default="hf-internal-testing/tiny-random-LlamaForCausalLM")
    parser.add_argument("--output_dir", type=str, default=".", help="Taken for the reference's command line; unused.")
    args = parser.parse_args(argv)

    set_seed(42)
    parallelism = ParallelismConfig(sp_backend="deepspeed", sp_size=SP_SIZE, sp_handler=DeepSpeedSequenceParallelConfig(
        sp_seq_length=256, sp_seq_length_is_variable=True, sp_attn_implementation="sdpa"))
    accelerator = Accelerator(parallelism_config=parallelism)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    ids = torch.arange(1, SEQ_LEN * SAMPLES + 1).view(-1, SEQ_LEN) % (model.config.vocab_size - 1) + 1
    positions = torch.arange(SEQ_LEN * SAMPLES).view(-1, SEQ_LEN) % SEQ_LEN
    loader = DataLoader(TensorDataset(ids, positions), batch_size=1, collate_fn=one_sample_per_batch)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    from deepspeed.utils import groups

    group = groups._get_sequence_parallel_group()
    unwrapped = accelerator.unwrap_model(model)
    losses = []
    for step, batch in enumerate(loader):
        optimizer.zero_grad()
        batch = {key: value.to(model.device) for key, value in batch.items()}
        assert batch["input_ids"].shape[-1] == SEQ_LEN // SP_SIZE, (
            f"each rank should hold {SEQ_LEN // SP_SIZE} tokens of the sequence, got {batch['input_ids'].shape[-1]}")
        outputs = model(**batch)
        shard_loss = unwrapped.loss_function(logits=outputs.logits, labels=None, shift_labels=batch["shift_labels"],
                                             vocab_size=unwrapped.config.vocab_size)
        loss = aggregated_loss(shard_loss, batch["shift_labels"], group, SP_SIZE)
        accelerator.print(f"{step}: loss={loss.item()}")
        accelerator.log({"train_loss": loss.item(), "step": step})
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.detach().float().reshape(1))
    assert losses, "the adapted loader gave no batch"
    mine = torch.cat(losses)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    assert all(math.isfinite(value) for value in mine.tolist()), f"a loss is not finite: {mine.tolist()}"
    assert all(torch.equal(mine, other) for other in gathered), "the ranks of a sequence disagree on its loss"
    accelerator.end_training()
    accelerator.print("ALST ULYSSES SP PASSED")


if __name__ == "__main__":
    main()
