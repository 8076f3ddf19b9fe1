"""A small language-model-shaped network for the quantization tests and bench: embedding, residual MLP blocks
with a layer norm, and an output head (left unquantized by default)."""
from __future__ import annotations

import json
import os

import torch
import torch.nn as nn
from safetensors.torch import save_file


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, vocab: int = 64, d: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(seed: int = 0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(**kwargs).eval()


def save_sharded(model: nn.Module, folder, shards: int) -> list[str]:
    """Write ``model``'s state dict as ``shards`` safetensors files plus a ``model.safetensors.index.json``."""
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    names = list(state)
    per = -(-len(names) // shards)
    weight_map, files = {}, []
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        if not part:
            continue
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, os.path.join(folder, file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
        files.append(os.path.join(folder, file))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return files
