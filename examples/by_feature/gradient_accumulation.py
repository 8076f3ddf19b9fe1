"""Gradient accumulation, including token-level loss normalisation for padded sequences.

    hasten launch -n 2 examples/by_feature/gradient_accumulation.py

A tiny next-token model on generated sequences of different lengths (padded with -100 labels). Each cycle's
loss is the sum over its real tokens on all processes divided by their count, so accumulated training equals
training on one big batch.
"""
import torch
from torch import nn

from hasten import Accelerator
from hasten.utils import tqdm

VOCAB, ACCUMULATION = 11, 4


def sequences(count: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        length = int(torch.randint(2, 16, (), generator=g))
        tokens = torch.randint(0, VOCAB, (16,), generator=g)
        labels = torch.roll(tokens, -1)
        labels[length:] = -100
        out.append((tokens, labels))
    return out


def main():
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION)
    model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(sequences(512, 0), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    iterator = iter(loader)
    # a bar on the main process only, in a terminal (disable=None)
    for cycle_index in tqdm(range(len(loader) // ACCUMULATION), desc="train", disable=None):
        cycle = [next(iterator) for _ in range(ACCUMULATION)]
        num_items = accelerator.reduce(sum((labels != -100).sum() for _, labels in cycle), reduction="sum")
        for tokens, labels in cycle:
            with accelerator.accumulate(model):
                logits = model(tokens)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                   reduction="sum")
                accelerator.backward(loss, num_items_in_batch=num_items)
                optimizer.step()
                optimizer.zero_grad()
        if cycle_index % 4 == 0:
            accelerator.print(f"cycle {cycle_index}: loss per token {loss.item() / max(1, int(num_items)):.4f}")
    accelerator.print("gradient accumulation example OK")


if __name__ == "__main__":
    main()
