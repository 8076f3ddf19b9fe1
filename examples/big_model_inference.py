"""Run a model larger than the memory you give it: build it empty, plan a device map, load, offload, run.

    python examples/big_model_inference.py [--memory 60MB]

No download: the script first writes a ~110 MB checkpoint of a small GPT-like model to a temporary folder
(standing in for weights you downloaded), then loads it as you would a real large model. With a CPU budget
of 60 MB, most blocks stay on disk and are read in only while they run; the output is checked
against the fully loaded model.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from hasten import infer_auto_device_map, init_empty_weights, load_checkpoint_and_dispatch
from hasten.utils import compute_module_sizes


class Block(nn.Module):
    """A pre-norm residual MLP block: never split across devices (the residual needs both halves)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 8000, width: int = 512, depth: int = 12):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in most language models

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def write_checkpoint(folder: Path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """Stand-in for downloaded weights: a random model saved as safetensors, plus its output on some input."""
    torch.manual_seed(0)
    model = TinyGPT().eval()
    ids = torch.randint(0, 8000, (2, 16))
    with torch.no_grad():
        expected = model(ids)
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}  # tied copies are saved once
    path = folder / "model.safetensors"
    save_file(state, path, metadata={"format": "pt"})
    return path, ids, expected


def main(memory: str = "60MB") -> None:
    with tempfile.TemporaryDirectory(prefix="hasten-example-") as tmp:
        folder = Path(tmp)
        checkpoint, ids, expected = write_checkpoint(folder)

        # 1. Build the model with no memory at all: every parameter is on the meta device.
        with init_empty_weights():
            model = TinyGPT()
        size = compute_module_sizes(model)[""]
        print(f"model: {size / 2**20:.0f} MiB of weights; CPU budget: {memory}")

        # 2. Plan: blocks stay whole; what does not fit in the budget goes to disk.
        device_map = infer_auto_device_map(model, max_memory={"cpu": memory}, no_split_module_classes=["Block"])
        on_disk = [name for name, device in device_map.items() if device == "disk"]
        print(f"device map: {dict(device_map)}")
        print(f"{len(on_disk)} part(s) on disk: {', '.join(on_disk)}")

        # 3. Load shard by shard (disk parts go straight to the offload folder) and attach the hooks.
        model = load_checkpoint_and_dispatch(model, checkpoint, device_map=device_map,
                                             offload_folder=folder / "offload", no_split_module_classes=["Block"])

        # 4. Run: disk blocks are read in just before their forward and dropped right after.
        with torch.no_grad():
            output = model(ids)
        print(f"output {tuple(output.shape)}, identical to the fully loaded model: {torch.equal(output, expected)}")
        assert torch.equal(output, expected)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", default="60MB", help="CPU memory budget for the weights (default: 60MB)")
    main(parser.parse_args().memory)
