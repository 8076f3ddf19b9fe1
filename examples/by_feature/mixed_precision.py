"""Mixed precision: bf16 autocast (fp16 with loss scaling on GPUs), fp32 outputs, skipped overflow steps.

    hasten launch -n 2 examples/by_feature/mixed_precision.py --mixed_precision bf16
"""
import argparse

import torch
from torch import nn

from hasten import Accelerator
from hasten.utils import tqdm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", default="bf16", choices=["no", "bf16", "fp16"])
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    g = torch.Generator().manual_seed(accelerator.process_index)
    for step in tqdm(range(100), desc="train", disable=None):  # a bar on the main process only
        x = torch.randn(32, 16, generator=g)
        out = model(x)                      # computed in low precision, returned in fp32
        loss = ((out - x.mean(1, keepdim=True)) ** 2).mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if optimizer.step_was_skipped:
            accelerator.print(f"step {step}: skipped (fp16 overflow), scale lowered")
    accelerator.print(f"{accelerator.mixed_precision}: output dtype {out.dtype}, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
