"""Small models shared by the big-model tests: a generator of random model shapes for the device-map grid, and
a little transformer-like model whose outputs are compared across placements."""
from __future__ import annotations

import random
from collections import OrderedDict

import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)


class Block(nn.Module):
    """A residual block: the kind of module that must not be split across devices."""

    def __init__(self, d, rng: random.Random):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = Attn(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        if rng.random() < 0.3:
            self.scale = nn.Parameter(torch.ones(d))  # a direct parameter next to children
        if rng.random() < 0.3:
            self.register_buffer("positions", torch.arange(d), persistent=rng.random() < 0.5)
        if rng.random() < 0.2:
            self.register_buffer("mask", torch.ones(d, dtype=torch.bool))
        if rng.random() < 0.2:  # a tie inside the block
            self.a = nn.Linear(d, d, bias=False)
            self.b = nn.Linear(d, d, bias=False)
            self.b.weight = self.a.weight


class Stage(nn.Module):
    """A container with its own parameter, holding blocks (two levels of nesting)."""

    def __init__(self, d, n, rng):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(d))
        self.blocks = nn.Sequential(*[Block(d, rng) for _ in range(n)])


def random_model(seed: int) -> nn.Module:
    """A random model on the meta device: nested Sequentials / ModuleLists, no-split blocks, direct parameters,
    buffers (int, bool, non-persistent), mixed dtypes and (sometimes) tied embeddings."""
    rng = random.Random(seed)
    d = rng.choice([4, 8, 16])
    with torch.device("meta"):
        parts = [("embed", nn.Embedding(rng.choice([10, 50, 100]), d))]
        for s in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.4:
                parts.append((f"stage{s}", Stage(d, rng.randint(1, 4), rng)))
            elif kind < 0.7:
                parts.append((f"layers{s}", nn.ModuleList([Block(d, rng) for _ in range(rng.randint(1, 5))])))
            else:
                parts.append((f"seq{s}", nn.Sequential(nn.Linear(d, d), nn.Sequential(nn.Linear(d, d), nn.ReLU()),
                                                        nn.LayerNorm(d))))
        parts.append(("norm", nn.LayerNorm(d)))
        parts.append(("head", nn.Linear(d, parts[0][1].num_embeddings, bias=rng.random() < 0.5)))
        model = nn.Sequential(OrderedDict(parts))
        if rng.random() < 0.3:
            model.register_parameter("temperature", nn.Parameter(torch.ones(1)))
        if rng.random() < 0.3:
            model.register_buffer("step", torch.zeros((), dtype=torch.int64))
    if rng.random() < 0.4:
        model.head.weight = model.embed.weight
    for name, module in list(model.named_children()):
        roll = rng.random()
        if roll < 0.15:
            module.half()
        elif roll < 0.25:
            module.to(torch.bfloat16)
    return model


class TinyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.register_buffer("gain", torch.ones(d))

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x)))) * self.gain


class TinyLM(nn.Module):
    """Embedding, a stack of residual blocks, a norm and an LM head tied to the embedding."""

    def __init__(self, vocab=40, d=16, layers=6, tie=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([TinyBlock(d) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids, scale=None):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        out = self.head(self.norm(x))
        return out if scale is None else out * scale


def trained_tiny_lm(seed: int = 0, **kwargs) -> TinyLM:
    """A TinyLM with random (non-default) weights and buffers, in eval mode."""
    torch.manual_seed(seed)
    model = TinyLM(**kwargs)
    with torch.no_grad():
        for block in model.blocks:
            block.gain.uniform_(0.5, 1.5)
            block.norm.weight.uniform_(0.5, 1.5)
    return model.eval()
