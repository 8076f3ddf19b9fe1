"""One training epoch of a small MLP on 2 processes (DDP, gloo): plain PyTorch vs hasten vs Accelerate.

    python bench/bench_training.py [--json out.json]   # launches itself on 2 processes, once per setting

The model is tiny so that the step time is dominated by framework overhead: the ratio shows what hasten
adds to a plain DDP loop (target <= 1.02, and not above the reference library). Three settings: fp32, bf16
autocast, and gradient accumulation over 4 batches. Each setting is one launch in which every library builds
its Accelerator once, as in real use. The variants take turns (their order rotating) for ``BENCH_PAIRS`` rounds
(default 30) after one untimed epoch each; ``ratio`` is the median over the rounds of variant / plain PyTorch in
the same round, so a slow moment of a shared machine counts against both.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from worker_launch import launch_worker

SAMPLES, BATCH, PAIRS = 4096, 32, int(os.environ.get("BENCH_PAIRS", 30))
CONFIGS = {"fp32": ("no", 1), "bf16": ("bf16", 1), "accumulation 4": ("no", 4)}


def relaunch(argv) -> list:
    rows = []
    for label in CONFIGS:
        rows += launch_worker(__file__, label, label=f"training-{label.replace(' ', '-')}")
    print(f"{'benchmark':40} {'variant':11} {'median ms':>10} {'ratio':>7}")
    for row in rows:
        print(f"{row['benchmark']:40} {row['variant']:11} {row['median_s'] * 1e3:10.1f} {row['ratio']:7.3f}")
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(rows, indent=2))
    return rows


def worker(label: str, json_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    precision, accumulation = CONFIGS[label]
    reference = None
    try:  # the reference shards on CPU only with cpu=True and only when it creates the process group itself
        import accelerate

        reference = accelerate.Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=accumulation)
    except ImportError:
        dist.init_process_group("gloo")
    import hasten

    mine = hasten.Accelerator(mixed_precision=precision, gradient_accumulation_steps=accumulation)
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, 32, generator=g), torch.randint(0, 10, (SAMPLES,), generator=g))

    def model_and_optimizer():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def plain():
        model, optimizer = model_and_optimizer()
        model = nn.parallel.DistributedDataParallel(model)
        loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))

        def epoch():
            for step, (x, y) in enumerate(loader):
                sync = (step + 1) % accumulation == 0 or step + 1 == len(loader)
                with model.no_sync() if not sync else torch.enable_grad():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        out = model(x)
                    loss = nn.functional.cross_entropy(out.float(), y) / accumulation
                    loss.backward()
                if sync:
                    optimizer.step()
                    optimizer.zero_grad()
        return epoch

    def with_library(accelerator):
        model, optimizer = model_and_optimizer()
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=BATCH))

        def epoch():
            for x, y in loader:
                with accelerator.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
        return epoch

    epochs = {"torch": plain(), "hasten": with_library(mine)}
    if reference is not None:
        assert reference.num_processes == world, "the reference library did not shard"
        epochs["accelerate"] = with_library(reference)
    times = {name: [] for name in epochs}
    for epoch in epochs.values():
        epoch()  # warm-up
    names = list(epochs)
    for round_index in range(PAIRS):
        shift = round_index % len(names)  # each variant runs first, second, ... in turn
        for name in names[shift:] + names[:shift]:
            dist.barrier()
            start = time.perf_counter()
            epochs[name]()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank's epoch
            times[name].append(float(elapsed))
    rows = [{"benchmark": f"DDP epoch, small MLP, {label}", "variant": name, "median_s": statistics.median(values),
             "min_s": min(values), "repeats": PAIRS,
             "ratio": statistics.median(mine / plain for mine, plain in zip(values, times["torch"])),
             "note": "median per-round ratio to plain DDP"}
            for name, values in times.items()]
    if dist.get_rank() == 0:
        Path(json_path).write_text(json.dumps(rows))
    dist.barrier()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        position = argv.index("--worker")
        worker(argv[position + 1], argv[position + 2])
        return None
    return relaunch(argv)


if __name__ == "__main__":
    main()
