"""FSDP2 on 2 CPU processes: memory per rank vs DDP, step time vs hand-written fully_shard, checkpoint costs.

    python bench/bench_fsdp.py [--json out.json]     # launches itself on 2 processes, once per variant

Model: 48 Linear(1024, 1024) layers (50M parameters, 200 MB in fp32) trained with AdamW, batch 8. Variants, each
in its own launch so that the peak RSS of a rank is its own: "ddp" (hasten, DDP), "hasten_fsdp2" (hasten,
FSDP2 with one unit per layer: size_based_wrap) and "torch_fsdp2" (the same sharding written by hand with
``fully_shard`` and torch's loop). Reported: median step time, peak RSS per rank after training (the highest of
the 2 ranks), and for hasten FSDP2 the time of save_state with sharded and with full files and the time
save_state(async_save=True) blocks the loop. Targets (issue 12): FSDP2 memory <= 0.6x DDP's, step time <= 1.03x
hand-written FSDP2, async stall <= 0.25x a synchronous save. The "paired" variant runs hasten's FSDP2 and the
hand-written one in the same processes, alternating steps, and reports the median per-pair ratio.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worker_launch import launch_worker, peak_rss_mb, report

LAYERS, WIDTH, BATCH, STEPS = 48, 1024, 8, int(os.environ.get("BENCH_STEPS", 8))
# variant -> (what runs, extra environment). hasten sets glibc's mmap threshold for CPU FSDP itself
# (utils/allocator.py); the hand-written loop gets the same policy for a fair step time, and runs once with the
# allocator's defaults for what a plain script gets.
VARIANTS = {
    "ddp": ("ddp", {}),
    "hasten_fsdp2": ("hasten_fsdp2", {}),
    "torch_fsdp2": ("torch_fsdp2", {"MALLOC_MMAP_THRESHOLD_": "65536"}),
    "torch_fsdp2_glibc_default": ("torch_fsdp2", {}),
    "hasten_fsdp2_allocator_untouched": ("hasten_fsdp2", {"HASTEN_CPU_MMAP_THRESHOLD": "0"}),
    "paired": ("paired", {}),  # both in one job, alternating steps
}


def build():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def run_steps(model, optimizer, backward, device="cpu") -> list:
    import torch

    generator = torch.Generator().manual_seed(1)
    times = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=generator)
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times[2:]  # the first steps allocate


def worker(variant: str, out: Path) -> None:
    import torch
    import torch.distributed as dist

    result = {"variant": variant}
    if variant == "torch_fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        model, _ = build()
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times = run_steps(model, optimizer, lambda loss: loss.backward())
    else:
        from hasten import Accelerator, FullyShardedDataParallelPlugin

        plugin = (FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="size_based_wrap",
                                                 min_num_params=WIDTH * WIDTH) if variant == "hasten_fsdp2" else None)
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
        model, optimizer = accelerator.prepare(*build())
        times = run_steps(model, optimizer, accelerator.backward)
        if variant == "hasten_fsdp2":
            result.update(checkpoint_costs(accelerator))
    result["step_s"] = statistics.median(times)
    result["peak_rss_mb"] = peak_rss_mb() if "rss_after_training" not in result else result.pop("rss_after_training")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    if dist.get_rank() == 0:
        merged = dict(everyone[0])
        merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in everyone)
        out.write_text(json.dumps(merged))
    dist.barrier()


def paired_steps(out: Path) -> None:
    """hasten FSDP2 and hand-written fully_shard in the same processes (same allocator, same mesh), one step of each
    in turn: the median of the per-pair step-time ratios resolves a few percent."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hasten import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="size_based_wrap", min_num_params=WIDTH * WIDTH))
    ours, our_optimizer = accelerator.prepare(*build())
    theirs, _ = build()
    mesh = accelerator.strategy.layout.submesh("dp_shard")
    for layer in theirs:
        fully_shard(layer, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    their_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)

    def one_step(model, optimizer, backward) -> float:
        x = torch.randn(BATCH, WIDTH, generator=generator)
        dist.barrier()
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    ratios = []
    for pair in range(int(os.environ.get("BENCH_PAIRS", 30)) + 2):
        order = [(ours, our_optimizer, accelerator.backward), (theirs, their_optimizer, lambda l: l.backward())]
        if pair % 2:
            order.reverse()
        times = {id(m): one_step(m, o, b) for m, o, b in order}
        if pair >= 2:  # the first pairs allocate
            ratios.append(times[id(ours)] / times[id(theirs)])
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, ratios)
    if dist.get_rank() == 0:
        per_pair = [max(values) for values in zip(*everyone)]  # a step is as slow as its slowest rank
        out.write_text(json.dumps({"variant": "paired", "median_ratio": statistics.median(per_pair),
                                   "pairs": len(per_pair)}))
    dist.barrier()


def checkpoint_costs(accelerator) -> dict:
    from hasten.checkpointing.checkpoint_io import FullStateCheckpointIO
    from hasten.strategies.fsdp.sharded_io import ShardedCheckpointIO

    costs = {"rss_after_training": peak_rss_mb()}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as work:
        folder = accelerator.gather_for_metrics([work], use_gather_object=True)[0]  # the main process's, for all
        for label, io in (("save_sharded_s", ShardedCheckpointIO()), ("save_full_s", FullStateCheckpointIO())):
            accelerator.strategy.checkpoint_io = io
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            accelerator.save_state(os.path.join(folder, label))
            costs[label] = time.perf_counter() - start
        accelerator.strategy.checkpoint_io = ShardedCheckpointIO()
        for label in ("async_first_stall_s", "async_stall_s"):  # the first allocates the CPU copy, later ones reuse it
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            accelerator.save_state(os.path.join(folder, label), async_save=True)
            costs[label] = time.perf_counter() - start
            accelerator.wait_for_checkpoint()
    return costs


def main(argv=None) -> list:
    argv = list(sys.argv[1:] if argv is None else argv)
    results = {variant: launch_worker(__file__, runs, extra, label=variant)
               for variant, (runs, extra) in VARIANTS.items()}
    ddp, ours, theirs = results["ddp"], results["hasten_fsdp2"], results["torch_fsdp2"]
    plain, untouched = results["torch_fsdp2_glibc_default"], results["hasten_fsdp2_allocator_untouched"]
    rows = [
        {"benchmark": "FSDP2 peak RSS per rank vs DDP", "variant": "hasten_fsdp2",
         "value": f"{ours['peak_rss_mb']:.0f} MB vs {ddp['peak_rss_mb']:.0f} MB",
         "ratio": ours["peak_rss_mb"] / ddp["peak_rss_mb"]},
        {"benchmark": "  same, allocator left alone", "variant": "hasten_fsdp2_allocator_untouched",
         "value": f"{untouched['peak_rss_mb']:.0f} MB", "ratio": untouched["peak_rss_mb"] / ddp["peak_rss_mb"]},
        {"benchmark": "hand-written fully_shard peak RSS vs DDP", "variant": "torch_fsdp2_glibc_default",
         "value": f"{plain['peak_rss_mb']:.0f} MB", "ratio": plain["peak_rss_mb"] / ddp["peak_rss_mb"]},
        {"benchmark": "FSDP2 step time vs hand-written fully_shard", "variant": "hasten_fsdp2 (same allocator)",
         "value": f"{ours['step_s'] * 1e3:.0f} ms vs {theirs['step_s'] * 1e3:.0f} ms",
         "ratio": ours["step_s"] / theirs["step_s"]},
        {"benchmark": "  same, both allocators left alone", "variant": "hasten_fsdp2_allocator_untouched",
         "value": f"{untouched['step_s'] * 1e3:.0f} ms vs {plain['step_s'] * 1e3:.0f} ms",
         "ratio": untouched["step_s"] / plain["step_s"]},
        {"benchmark": "FSDP2 step time vs hand-written, paired in one job", "variant": "paired",
         "value": f"median of {results['paired']['pairs']} per-pair ratios",
         "ratio": results["paired"]["median_ratio"]},
        {"benchmark": "DDP step time (reference)", "variant": "ddp",
         "value": f"{ddp['step_s'] * 1e3:.0f} ms", "ratio": ddp["step_s"] / theirs["step_s"]},
        {"benchmark": "save_state sharded vs full", "variant": "hasten_fsdp2",
         "value": f"{ours['save_sharded_s']:.2f} s vs {ours['save_full_s']:.2f} s",
         "ratio": ours["save_sharded_s"] / ours["save_full_s"]},
        {"benchmark": "async save stall vs sync sharded save", "variant": "hasten_fsdp2",
         "value": f"{ours['async_stall_s']:.2f} s vs {ours['save_sharded_s']:.2f} s",
         "ratio": ours["async_stall_s"] / ours["save_sharded_s"]},
        {"benchmark": "  first async save (allocates its copy)", "variant": "hasten_fsdp2",
         "value": f"{ours['async_first_stall_s']:.2f} s", "ratio": ours["async_first_stall_s"] / ours["save_sharded_s"]},
        {"benchmark": "async save stall vs sync full save", "variant": "hasten_fsdp2",
         "value": f"{ours['async_stall_s']:.2f} s vs {ours['save_full_s']:.2f} s",
         "ratio": ours["async_stall_s"] / ours["save_full_s"]},
    ]
    return report(rows, argv)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        (paired_steps if sys.argv[2] == "paired" else lambda out: worker(sys.argv[2], out))(Path(sys.argv[3]))
    else:
        main()
