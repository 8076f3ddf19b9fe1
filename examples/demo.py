"""A complete training script that runs unchanged on 1 or N processes.

    hasten launch -n 2 examples/demo.py            # what `make demo` runs
    python examples/demo.py --mixed_precision no   # one process
    hasten launch -n 2 examples/demo.py --project_dir runs/demo && hasten report runs/demo   # curves as HTML

A small classifier learns a generated two-spirals data set: mixed precision, gradient accumulation, gradient
clipping, a learning-rate schedule, and evaluation whose accuracy counts every sample exactly once (the
evaluation set does not divide evenly across processes). The loops show a progress bar on the main process, in a
terminal; with --project_dir the loss, learning rate, throughput and accuracy are logged with the dependency-free
JSONL tracker.
"""
import argparse
import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed, tqdm


def spirals(num_samples: int, seed: int) -> TensorDataset:
    """Two interleaved spirals in 2-D (one and a half turns), labels 0 and 1 (generated, no download)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(num_samples, generator=g) * 2 * math.pi + 0.5
    label = torch.randint(0, 2, (num_samples,), generator=g)
    sign = 1 - 2 * label.float()
    x = torch.stack([sign * t * torch.cos(t), sign * t * torch.sin(t)], dim=1) / 4
    x += 0.02 * torch.randn(num_samples, 2, generator=g)
    return TensorDataset(x, label)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", default=None, choices=["no", "bf16", "fp16"])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--project_dir", default=None, help="log metrics to PROJECT_DIR/demo/metrics.jsonl")
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision or "bf16", gradient_accumulation_steps=2,
                              log_with="jsonl" if args.project_dir else None, project_dir=args.project_dir)
    accelerator.init_trackers("demo", config={"epochs": args.epochs, "lr": 3e-3, "batch_size": 64,
                                              "processes": accelerator.num_processes})
    set_seed(0)
    train = DataLoader(spirals(4096, seed=0), batch_size=64, shuffle=True)
    evaluate = DataLoader(spirals(1001, seed=1), batch_size=100)  # 1001: uneven on purpose
    model = nn.Sequential(nn.Linear(2, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = args.epochs * math.ceil(len(train) / accelerator.num_processes / 2) * accelerator.num_processes
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    model, optimizer, train, evaluate, scheduler = accelerator.prepare(model, optimizer, train, evaluate, scheduler)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        started, seen = time.perf_counter(), 0
        # a bar on the main process only, and only in a terminal (disable=None: tqdm's "off when not a TTY")
        for x, y in tqdm(train, desc=f"epoch {epoch} train", leave=False, disable=None):
            seen += len(x)
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                accelerator.log({"train/loss": loss.detach().float(), "lr": scheduler.get_last_lr()[0]}, step=step)
        accelerator.log({"samples_per_second": seen * accelerator.num_processes / (time.perf_counter() - started)},
                        step=step)
        model.eval()
        correct = total = 0
        for x, y in tqdm(evaluate, desc=f"epoch {epoch} eval", leave=False, disable=None):
            with torch.no_grad():
                predictions = model(x).argmax(-1)
            predictions, y = accelerator.gather_for_metrics((predictions, y))
            correct += int((predictions == y).sum())
            total += len(y)
        accelerator.log({"eval/accuracy": correct / total}, step=step)
        accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}  accuracy {correct / total:.3f} on {total} samples")
    accelerator.end_training()

    assert total == 1001, f"evaluation counted {total} samples instead of 1001"
    if correct / total < 0.9:
        raise SystemExit(f"demo failed: accuracy {correct / total:.3f} < 0.9")
    accelerator.print(f"demo OK: {accelerator.num_processes} process(es), {accelerator.mixed_precision} precision, "
                      f"accuracy {correct / total:.3f}")


if __name__ == "__main__":
    main()
