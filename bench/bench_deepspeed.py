"""DeepSpeed ZeRO on 2 CPU processes: step time vs the same engine driven by hand, memory per rank, save costs.

    python bench/bench_deepspeed.py [--json out.json]     # launches itself on 2 processes, once per variant

Model: 48 Linear(1024, 1024) layers (50M parameters, 200 MB in fp32) trained with AdamW, batch 8 per rank, fp32.
Each variant runs in its own launch, so that the peak RSS of a rank is its own:

- "paired_zero2" / "paired_zero3": hasten's engine and one built by hand with ``deepspeed.initialize`` from the
  config hasten built (read back from hasten's engine), in the same 2 processes, one step of each in turn (the
  order reversed every other pair): the median of the per-pair step-time ratios (target <= 1.03x);
- "ddp", "zero2", "zero3", "zero3_offload" (optimizer and parameters offloaded to the CPU): peak RSS per rank
  after a few steps (the higher of the 2 ranks). On a CPU-only machine offload moves nothing off an accelerator,
  so it cannot save memory here: the row says what it costs. Three more ZeRO-3 runs say where its memory goes:
  "zero3_by_hand" (the engine built from hasten's config without hasten), "zero3_bounded" (about 2 layers kept
  gathered instead of DeepSpeed's 1e9-parameter defaults) and "zero3_mmap_64k" (glibc hands freed buffers of
  64 KiB and more back to the system, the policy hasten's FSDP strategy sets on CPUs);
- "zero2" also times ``save_state`` against the engine's own ``engine.save_checkpoint`` on the same trained
  engine, and against save_checkpoint followed by an fsync of its files (the durability save_state gives), in
  turn, medians (hasten adds its transaction: staging, checksums, marker, fsync, rng and loader files).

BENCH_STEPS (training steps per memory variant), BENCH_PAIRS (paired steps) and BENCH_SAVES (saves of each kind)
shorten or lengthen the run (about 5 minutes with the defaults on 2 cores).
DeepSpeed's CPU ops are compiled once into torch's extension cache (TORCH_EXTENSIONS_DIR, ~/.cache/torch_extensions).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worker_launch import launch_worker, peak_rss_mb, report

LAYERS, WIDTH, BATCH = 48, 1024, 8
STEPS = int(os.environ.get("BENCH_STEPS", 6))
PAIRS = int(os.environ.get("BENCH_PAIRS", 30))
SAVES = int(os.environ.get("BENCH_SAVES", 5))
# variant -> (ZeRO stage or None for DDP, offload to the CPU, ZeRO-3 limits or None for DeepSpeed's defaults).
# DeepSpeed's ZeRO-3 defaults (stage3_max_live_parameters = stage3_max_reuse_distance = 1e9) may keep every
# gathered layer of this 50M-parameter model until its backward; "zero3_bounded" allows about 2 layers.
BOUNDED = {"stage3_max_live_parameters": 2 * WIDTH * WIDTH, "stage3_max_reuse_distance": 0,
           "stage3_prefetch_bucket_size": WIDTH * WIDTH}
SETTINGS = {"ddp": (None, False, None), "zero2": (2, False, None), "zero3": (3, False, None),
            "zero3_bounded": (3, False, BOUNDED), "zero3_offload": (3, True, None),
            "zero3_mmap_64k": (3, False, None), "zero3_by_hand": (3, False, None),
            "paired_zero2": (2, False, None), "paired_zero3": (3, False, None)}
# "zero3_mmap_64k" runs with MALLOC_MMAP_THRESHOLD_=65536; "zero3_by_hand" gets the "zero3" run's config in
# BENCH_DS_CONFIG.


def build():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def loader():
    """The training loader: prepared with the model, it tells DeepSpeed the micro-batch size (BATCH per rank)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.zeros(BATCH * 4, WIDTH)), batch_size=BATCH)


def prepared(stage, offload: bool, limits=None):
    """hasten's Accelerator and the prepared (model, optimizer): DDP without a stage, else a DeepSpeed engine."""
    from hasten import Accelerator, DeepSpeedPlugin

    plugin = None
    if limits is not None:  # a config of our own: the batch sizes stay "auto", filled from the loader
        plugin = DeepSpeedPlugin(hf_ds_config={
            "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": stage, **limits}})
    elif stage is not None:
        device = "cpu" if offload else "none"
        plugin = DeepSpeedPlugin(zero_stage=stage, offload_optimizer_device=device,
                                 offload_param_device=device if stage == 3 else "none")
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    model, optimizer, _ = accelerator.prepare(*build(), loader())
    return accelerator, model, optimizer


def by_hand(config: dict):
    """The engine built with deepspeed.initialize alone, and a step that drives it the canonical way."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # what a CPU-only script sets before importing deepspeed
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    model, optimizer = build()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(x):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()

    return engine, step


def gather_to_rank0(value):
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def memory_worker(variant: str, out: Path) -> None:
    """Train STEPS steps, record the peak RSS; the ZeRO-2 run then times save_state vs engine.save_checkpoint."""
    import torch
    import torch.distributed as dist

    if variant.endswith("_by_hand"):
        model, step = by_hand(json.loads(os.environ["BENCH_DS_CONFIG"]))
    else:
        accelerator, model, optimizer = prepared(*SETTINGS[variant])

        def step(x):
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    generator = torch.Generator().manual_seed(1)
    times = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=generator)
        start = time.perf_counter()
        step(x)
        times.append(time.perf_counter() - start)
    result = {"variant": variant, "step_s": statistics.median(times[2:] or times), "peak_rss_mb": peak_rss_mb()}
    if hasattr(model, "config"):  # a DeepSpeed engine: the config it was built from
        result["config"] = model.config
    if variant == "zero2":
        result.update(save_costs(accelerator, model))
    everyone = gather_to_rank0(result)
    if dist.get_rank() == 0:
        merged = dict(everyone[0])
        merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in everyone)
        merged["step_s"] = max(r["step_s"] for r in everyone)
        for key in ("save_state_s", "save_checkpoint_s", "save_checkpoint_fsync_s"):  # per trial, the slower rank
            if key in merged:
                merged[key] = [max(values) for values in zip(*(r[key] for r in everyone))]
        out.write_text(json.dumps(merged))
    dist.barrier()


def save_costs(accelerator, engine) -> dict:
    """save_state, the engine's own save_checkpoint, and save_checkpoint followed by an fsync of its files (the
    durability save_state gives), in turn SAVES times each on the same trained engine. Every trial writes a fresh
    folder, removed afterwards (untimed)."""
    import torch.distributed as dist

    labels = ["save_state_s", "save_checkpoint_s", "save_checkpoint_fsync_s"]
    costs = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as work:
        root = gather_to_rank0(work)[0]  # the main process's folder, for every rank
        for trial in range(SAVES):
            for label in labels[trial % 3:] + labels[:trial % 3]:  # each goes first in turn
                folder = os.path.join(root, f"{label}-{trial}")
                dist.barrier()
                start = time.perf_counter()
                if label == "save_state_s":
                    accelerator.save_state(folder)
                else:
                    engine.save_checkpoint(folder, tag="pytorch_model")
                    if label == "save_checkpoint_fsync_s":
                        fsync_share(folder)
                costs[label].append(time.perf_counter() - start)
                dist.barrier()
                if dist.get_rank() == 0:
                    shutil.rmtree(folder)
    return costs


def fsync_share(folder: str) -> None:
    """Flush this rank's share of the files under ``folder`` to disk (all ranks together: every file once)."""
    import torch.distributed as dist

    dist.barrier()  # every rank's files are written
    files = sorted(str(path) for path in Path(folder).rglob("*") if path.is_file())
    for name in files[dist.get_rank()::dist.get_world_size()]:
        handle = os.open(name, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def paired_worker(variant: str, out: Path) -> None:
    """hasten's engine and the same engine built by hand in the same processes, one step of each in turn: the
    median of the per-pair ratios resolves a few percent where separate launches swing more."""
    import torch
    import torch.distributed as dist

    accelerator, ours, our_optimizer = prepared(*SETTINGS[variant])
    config = copy.deepcopy(ours.config)  # the config hasten resolved and built its engine from
    _, deepspeed_step = by_hand(config)
    generator = torch.Generator().manual_seed(1)

    def hasten_step(x):
        loss = ours(x).pow(2).mean()
        accelerator.backward(loss)
        our_optimizer.step()
        our_optimizer.zero_grad()

    def timed(step) -> float:
        x = torch.randn(BATCH, WIDTH, generator=generator)
        dist.barrier()
        start = time.perf_counter()
        step(x)
        return time.perf_counter() - start

    ratios, hasten_times, deepspeed_times = [], [], []
    for pair in range(PAIRS + 2):
        order = [hasten_step, deepspeed_step]
        if pair % 2:
            order.reverse()
        times = {step: timed(step) for step in order}
        if pair >= 2:  # the first pairs allocate
            ratios.append(times[hasten_step] / times[deepspeed_step])
            hasten_times.append(times[hasten_step])
            deepspeed_times.append(times[deepspeed_step])
    everyone = gather_to_rank0((ratios, hasten_times, deepspeed_times))
    if dist.get_rank() == 0:
        per_pair = [max(values) for values in zip(*(r[0] for r in everyone))]  # a step is as slow as its slowest rank
        slowest = [[max(values) for values in zip(*(r[i] for r in everyone))] for i in (1, 2)]
        out.write_text(json.dumps({"variant": variant, "median_ratio": statistics.median(per_pair),
                                   "pairs": len(per_pair), "hasten_step_s": statistics.median(slowest[0]),
                                   "deepspeed_step_s": statistics.median(slowest[1]),
                                   "stage": config["zero_optimization"]["stage"]}))
    dist.barrier()


def rows_from(results: dict) -> list:
    ddp, z2, z3, bounded, off, hand, mmap = (results[v] for v in (
        "ddp", "zero2", "zero3", "zero3_bounded", "zero3_offload", "zero3_by_hand", "zero3_mmap_64k"))
    rows = []
    for variant in ("paired_zero2", "paired_zero3"):
        paired = results[variant]
        rows.append({"benchmark": f"ZeRO-{paired['stage']} step time vs deepspeed.initialize, paired",
                     "variant": variant,
                     "value": f"{paired['hasten_step_s'] * 1e3:.0f} vs {paired['deepspeed_step_s'] * 1e3:.0f} ms "
                              f"({paired['pairs']} pairs)",
                     "ratio": paired["median_ratio"]})
    measured = (("ZeRO-2", z2), ("ZeRO-3", z3), ("ZeRO-3 by hand, no hasten", hand),
                ("ZeRO-3, 2 layers live", bounded), ("ZeRO-3, mmap threshold 64 KiB", mmap),
                ("ZeRO-3 + CPU offload", off))
    for name, result in measured:
        rows.append({"benchmark": f"{name} peak RSS per rank vs DDP", "variant": result["variant"],
                     "value": f"{result['peak_rss_mb']:.0f} MB vs {ddp['peak_rss_mb']:.0f} MB",
                     "ratio": result["peak_rss_mb"] / ddp["peak_rss_mb"]})
    for name, result in measured:
        rows.append({"benchmark": f"{name} step time vs DDP (separate launches)", "variant": result["variant"],
                     "value": f"{result['step_s'] * 1e3:.0f} ms vs {ddp['step_s'] * 1e3:.0f} ms",
                     "ratio": result["step_s"] / ddp["step_s"]})
    ours = statistics.median(z2["save_state_s"])
    for label, name in (("save_checkpoint_s", "engine.save_checkpoint"),
                        ("save_checkpoint_fsync_s", "save_checkpoint + fsync")):
        theirs = statistics.median(z2[label])
        rows.append({"benchmark": f"ZeRO-2 save_state vs {name}", "variant": "zero2",
                     "value": f"{ours:.2f} s vs {theirs:.2f} s (median of {len(z2[label])})", "ratio": ours / theirs})
    return rows


def main(argv=None) -> list:
    argv = list(sys.argv[1:] if argv is None else argv)
    results = {}
    for variant in SETTINGS:
        extra = {"MALLOC_MMAP_THRESHOLD_": "65536"} if variant == "zero3_mmap_64k" else {}
        if variant.endswith("_by_hand"):  # hasten's config for the same stage
            extra["BENCH_DS_CONFIG"] = json.dumps(results[variant.removesuffix("_by_hand")]["config"])
        started = time.perf_counter()
        results[variant] = launch_worker(__file__, variant, extra)
        print(f"[{variant}: {time.perf_counter() - started:.0f} s]", flush=True)
    rows = report(rows_from(results), argv, widths=(64, 34))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        name = sys.argv[2]
        (paired_worker if name.startswith("paired") else memory_worker)(name, Path(sys.argv[3]))
    else:
        main()
