"""The strategy conformance suite's second workload: a tiny causal language model, for the strategies that need
attention heads and a transformers config (DeepSpeed sequence parallelism, ``ds_sp2``), next to the same model on
one process (``lm_single``), so that their checkpoints cross.

A Llama built from its config (sdpa attention, untied embeddings), token sequences whose first 1-5 tokens are not
counted (label -100: the two halves of a sequence count different numbers of tokens, which the sequence-parallel
loss must weigh), trained with AdamW, a StepLR schedule, accumulation and clipping, like the MLP workload.

The user's loss (``loss``): whole sequences give transformers' own loss; under sequence parallelism each rank holds
a part of every sequence (``shift_labels``), and the loss of the whole sequences is the token-weighted mean of the
ranks' losses over the group, gathered differentiably, as the reference's ALST recipe writes it.

``reference_run`` is plain PyTorch on one process. It must run before a sequence-parallel ``prepare``: DeepSpeed's
Ulysses replaces transformers' sdpa attention function for the whole process.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from hasten.utils import set_seed

SAMPLES, SEQUENCE, VOCABULARY, MICRO_BATCH = 32, 16, 64, 2


def fresh_objects():
    from transformers import LlamaConfig, LlamaForCausalLM

    set_seed(7)
    config = LlamaConfig(vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    return model, optimizer, scheduler


def samples() -> list:
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCABULARY, (SAMPLES, SEQUENCE), generator=generator)
    rows = []
    for index in range(SAMPLES):
        labels = ids[index].clone()
        labels[: index % 5 + 1] = -100  # a prompt that is not counted
        rows.append({"input_ids": ids[index], "position_ids": torch.arange(SEQUENCE), "labels": labels})
    return rows


def collate(rows: list) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def loader() -> DataLoader:
    return DataLoader(samples(), batch_size=MICRO_BATCH, collate_fn=collate)


def loss(accelerator, model, batch) -> torch.Tensor:
    outputs = model(**batch)
    if "shift_labels" not in batch:  # whole sequences: transformers computes the loss from the labels
        return outputs.loss
    # DeepSpeed sequence parallelism: this rank's part of each sequence; the loss of the whole sequences
    from deepspeed.utils import groups

    group = groups._get_sequence_parallel_group()
    unwrapped = accelerator.unwrap_model(model)
    shift_labels = batch["shift_labels"]
    part = unwrapped.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                   vocab_size=unwrapped.config.vocab_size)
    losses = torch.distributed.nn.functional.all_gather(part, group=group)
    counted = torch.distributed.nn.functional.all_gather((shift_labels != -100).view(-1).sum(), group=group)
    total = sum(rank_loss * tokens for rank_loss, tokens in zip(losses, counted) if tokens > 0)
    return total / max(sum(counted), 1)


def reference_run(batches_per_step: int, scheduler_steps: int, accumulation: int, max_norm: float):
    """Plain PyTorch, one process: each optimizer step trains the ``batches_per_step x accumulation`` micro-batches
    the strategy's processes train in one accumulation cycle, in order, each loss divided by their number; the
    scheduler advances ``scheduler_steps`` per optimizer step (as the prepared scheduler does). Returns the model
    and each step's mean loss."""
    model, optimizer, scheduler = fresh_objects()
    batches = list(loader())
    per_step = batches_per_step * accumulation
    losses = []
    for start in range(0, len(batches), per_step):
        cycle = batches[start:start + per_step]
        step_losses = []
        for batch in cycle:
            value = model(**batch).loss
            (value / per_step).backward()
            step_losses.append(value.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        for _ in range(scheduler_steps):
            scheduler.step()
        optimizer.zero_grad()
        losses.append(sum(step_losses) / len(step_losses))
    return model, losses
