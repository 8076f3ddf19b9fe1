"""Tensor and pipeline parallelism on 2 CPU processes: TP memory per rank vs DDP, TP step time vs a hand-written
``parallelize_module`` loop, and the pipeline bubble of GPipe against its theory.

    python bench/bench_model_parallel.py [--json out.json]     # launches itself on 2 processes, once per variant

Tensor parallelism. Model: ``BLOCKS`` residual MLP blocks (Linear(1024, 4096) -> GELU -> Linear(4096, 1024); 24
blocks are 201M parameters, 805 MB in fp32), AdamW, batch 8, plan ``{"blocks.*.fc1": "colwise", "blocks.*.fc2":
"rowwise"}``. Each variant runs in its own launch, so that the peak RSS of a rank is its own (the higher of the 2
ranks, after training; it includes building the whole model on every rank before it is split):

- "ddp": hasten, DDP (each rank holds the whole model, its gradients and AdamW's state);
- "hasten_tp": hasten, ``ParallelismConfig(tp_size=2)`` with the plan above;
- "torch_tp": the same plan applied by hand with ``parallelize_module`` and a plain torch loop;
- "paired_tp": hasten's TP model and the hand-written one in the same 2 processes (same mesh, same allocator), one
  step of each in turn (the order reversed every other pair), 2 warm-up pairs then ``PAIRS``: the median of the
  per-pair step-time ratios, each pair's time being its slower rank's (the issue's target, on GPUs, is 1.05x).

Pipeline parallelism ("pipeline"): ``PP_BLOCKS`` of the same blocks cut into 2 stages (``split_model``), GPipe
(``build_pipeline(schedule="gpipe")``), a fixed batch of ``PP_BATCH`` rows split into m = 1, 2, 4, 8
micro-batches, MSE loss. What is measured, for each m, in ``PP_STEPS`` iterations after one warm-up (each
iteration one of each, the order alternating, so a drifting machine load moves both alike):

- measured(m): ``pipe.step`` (forward and backward, no optimizer step, ``broadcast_loss=False``), the slower rank;
- ideal(m): the same work with no bubble: each rank runs its own stage's forward on the m micro-batches, then their
  backward (as GPipe orders them), alone, with no communication and no waiting for the other stage (which does the
  same on its own core); the slower stage sets the pace. This is about m x the stage time per micro-batch;
- measured bubble = 1 - ideal / measured (median of the per-iteration ratios), against the theory
  (p - 1) / (m + p - 1) for p = 2 stages. On 2 CPU cores with gloo the measured bubble also holds the
  point-to-point sends, their copies and the schedule's own bookkeeping, none of which the theory counts.

A "one process" figure times forward + backward of the whole pipeline model on the whole batch on one rank: the
pipeline's speedup over it, against the theory p m / (m + p - 1) (which assumes a micro-batch costs 1/m of the
batch; on a CPU small micro-batches are less efficient, which the ideal above includes and this theory does not).

BENCH_BLOCKS, BENCH_STEPS, BENCH_PAIRS and PP_STEPS (environment) shorten or lengthen the run (about 4 minutes
with the defaults on 2 cores).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from worker_launch import launch_worker, peak_rss_mb, report

WIDTH, HIDDEN, BATCH = 1024, 4096, 8
BLOCKS = int(os.environ.get("BENCH_BLOCKS", 24))
STEPS = int(os.environ.get("BENCH_STEPS", 6))
PAIRS = int(os.environ.get("BENCH_PAIRS", 30))
PLAN = {"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}
PP_BLOCKS, PP_BATCH, PP_STAGES, MICRO_BATCHES = 8, 256, 2, (1, 2, 4, 8)
PP_STEPS = int(os.environ.get("PP_STEPS", 8))
VARIANTS = ("ddp", "hasten_tp", "torch_tp", "paired_tp", "pipeline")


def build(blocks: int = BLOCKS):
    """The MLP-block stack, seeded: every rank and both paired models start alike. No optimizer here: one built on
    the whole model's parameters would keep them alive after parallelize_module replaces them."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)

        def forward(self, hidden):
            return hidden + self.fc2(self.act(self.fc1(hidden)))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, hidden):
            for block in self.blocks:
                hidden = block(hidden)
            return hidden

    torch.manual_seed(0)
    return Stack()


def adamw(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def parallelize_by_hand(model, mesh):
    """The plan written with torch's own ParallelStyles (parallelize_module expands the ``*``)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh, {"blocks.*.fc1": ColwiseParallel(), "blocks.*.fc2": RowwiseParallel()})


def gather(value) -> list:
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def training_step(model, optimizer, backward, x) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    loss = model(x).pow(2).mean()
    backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start


def hasten_prepared(tensor_parallel: bool):
    from hasten import Accelerator, ParallelismConfig
    from hasten.utils import TorchTensorParallelConfig

    config = (ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=PLAN))
              if tensor_parallel else None)
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    model = build()
    model, optimizer = accelerator.prepare(model, adamw(model))  # prepare re-points AdamW at the split parameters
    return accelerator, model, optimizer


def memory_worker(variant: str, out: Path) -> None:
    """Train STEPS steps; the peak RSS and the median step time (after 2 that allocate), slower rank of each."""
    import torch
    import torch.distributed as dist

    if variant == "torch_tp":
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
        model = parallelize_by_hand(build(), mesh)
        optimizer = adamw(model)
        backward = torch.Tensor.backward
    else:
        accelerator, model, optimizer = hasten_prepared(variant == "hasten_tp")
        backward = accelerator.backward
    generator = torch.Generator().manual_seed(1)
    times = [training_step(model, optimizer, backward, torch.randn(BATCH, WIDTH, generator=generator))
             for _ in range(STEPS)]
    everyone = gather({"times": times, "peak_rss_mb": peak_rss_mb()})
    if dist.get_rank() == 0:
        per_step = [max(values) for values in zip(*(r["times"] for r in everyone))]
        out.write_text(json.dumps({"variant": variant, "step_s": statistics.median(per_step[2:] or per_step),
                                   "peak_rss_mb": max(r["peak_rss_mb"] for r in everyone)}))
    dist.barrier()


def paired_worker(out: Path) -> None:
    """hasten's TP model and the hand-written one in the same processes, one step of each in turn."""
    import torch
    import torch.distributed as dist

    accelerator, ours, our_optimizer = hasten_prepared(tensor_parallel=True)
    theirs = parallelize_by_hand(build(), accelerator.strategy.layout.submesh("tp"))
    their_optimizer = adamw(theirs)
    generator = torch.Generator().manual_seed(1)  # the same on both ranks: a TP group sees one batch
    runs = {"hasten": (ours, our_optimizer, accelerator.backward),
            "torch": (theirs, their_optimizer, torch.Tensor.backward)}
    times = {"hasten": [], "torch": []}
    for pair in range(PAIRS + 2):
        order = ["hasten", "torch"] if pair % 2 == 0 else ["torch", "hasten"]
        for name in order:
            times[name].append(training_step(*runs[name], torch.randn(BATCH, WIDTH, generator=generator)))
    everyone = gather(times)
    if dist.get_rank() == 0:
        slowest = {name: [max(values) for values in zip(*(r[name] for r in everyone))][2:] for name in times}
        ratios = [a / b for a, b in zip(slowest["hasten"], slowest["torch"])]
        out.write_text(json.dumps({"variant": "paired_tp", "median_ratio": statistics.median(ratios),
                                   "pairs": len(ratios), "hasten_s": statistics.median(slowest["hasten"]),
                                   "torch_s": statistics.median(slowest["torch"])}))
    dist.barrier()


def stage_alone(stage, micro_batches: list, is_first: bool, is_last: bool) -> float:
    """This rank's share of a GPipe step done alone: its stage's forward on every micro-batch, then the backward of
    each (the loss on the last stage, the input's gradient where the pipeline sends one back), no communication and
    no waiting for the other stage. The time of the same work with no bubble."""
    import torch
    import torch.nn.functional as F

    inputs = [x.detach().requires_grad_(not is_first) for x in micro_batches]
    start = time.perf_counter()
    outputs = [stage(x) for x in inputs]
    for output in outputs:
        if is_last:
            F.mse_loss(output, torch.zeros_like(output)).backward()
        else:
            output.backward(torch.ones_like(output))
    elapsed = time.perf_counter() - start
    stage.zero_grad()
    return elapsed


def pipeline_worker(out: Path) -> None:
    """GPipe on 2 stages for each number of micro-batches m: each step timed against the same work done alone by
    each stage (alternating, one of each per iteration), so a drifting machine load moves both alike."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from hasten.strategies.model_parallel.pipeline import build_pipeline, split_model
    from hasten.state import PartialState

    PartialState()
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(1)
    inputs, target = torch.randn(PP_BATCH, WIDTH, generator=generator), torch.zeros(PP_BATCH, WIDTH)
    result = {"micro_batches": {}}
    if rank == 0:  # no pipeline: the whole model on the whole batch in one process (the other waits)
        whole = build(PP_BLOCKS)
        result["one_process_s"] = statistics.median(
            stage_alone(whole, [inputs], is_first=True, is_last=True) for _ in range(PP_STEPS + 1))
        del whole
    dist.barrier()
    for m in MICRO_BATCHES:
        stages = split_model(build(PP_BLOCKS), PP_STAGES)
        pipe = build_pipeline(stages, rank, None, schedule="gpipe", num_micro_batches=m, loss_fn=F.mse_loss,
                              broadcast_loss=False)
        del stages
        stage = pipe.modules[0]
        # the first stage gets the batch's micro-batches, the second hidden states of the same shape
        micro = list(inputs.chunk(m)) if pipe.is_first else [torch.randn(PP_BATCH // m, WIDTH, generator=generator)
                                                             for _ in range(m)]
        times = {"pipeline": [], "alone": []}
        for iteration in range(PP_STEPS + 1):
            order = ["pipeline", "alone"] if iteration % 2 == 0 else ["alone", "pipeline"]
            for what in order:
                dist.barrier()
                if what == "alone":
                    times[what].append(stage_alone(stage, micro, pipe.is_first, pipe.is_last))
                    continue
                start = time.perf_counter()
                pipe.step(inputs, target)
                times[what].append(time.perf_counter() - start)
                stage.zero_grad()
        result["micro_batches"][m] = {what: values[1:] for what, values in times.items()}  # the first allocates
        del pipe, stage
        dist.barrier()
    everyone = gather(result)
    if rank == 0:
        summary = {"variant": "pipeline", "one_process_s": everyone[0]["one_process_s"], "rows": []}
        for m in MICRO_BATCHES:
            runs = [r["micro_batches"][m] for r in everyone]
            measured = [max(values) for values in zip(*(run["pipeline"] for run in runs))]  # the slower rank
            ideal = [max(values) for values in zip(*(run["alone"] for run in runs))]  # the slower stage
            summary["rows"].append({
                "m": m, "measured_s": statistics.median(measured), "ideal_s": statistics.median(ideal),
                "stage_each_s": [statistics.median(run["alone"]) / m for run in runs],
                "ideal_over_measured": statistics.median(i / t for i, t in zip(ideal, measured)),
                "steps": len(measured)})
        out.write_text(json.dumps(summary))
    dist.barrier()


def tensor_parallel_rows(results: dict) -> list:
    ddp, ours, theirs, paired = (results[name] for name in ("ddp", "hasten_tp", "torch_tp", "paired_tp"))
    return [
        {"benchmark": "TP=2 peak RSS per rank vs DDP", "variant": "hasten_tp",
         "value": f"{ours['peak_rss_mb']:.0f} MB vs {ddp['peak_rss_mb']:.0f} MB",
         "ratio": ours["peak_rss_mb"] / ddp["peak_rss_mb"]},
        {"benchmark": "  parallelize_module by hand, peak RSS vs DDP", "variant": "torch_tp",
         "value": f"{theirs['peak_rss_mb']:.0f} MB", "ratio": theirs["peak_rss_mb"] / ddp["peak_rss_mb"]},
        {"benchmark": "TP=2 step time vs DDP (separate launches)", "variant": "hasten_tp",
         "value": f"{ours['step_s'] * 1e3:.0f} ms vs {ddp['step_s'] * 1e3:.0f} ms",
         "ratio": ours["step_s"] / ddp["step_s"]},
        {"benchmark": "TP=2 step time vs by hand (separate launches)", "variant": "hasten_tp",
         "value": f"{ours['step_s'] * 1e3:.0f} ms vs {theirs['step_s'] * 1e3:.0f} ms",
         "ratio": ours["step_s"] / theirs["step_s"]},
        {"benchmark": "TP=2 step time vs by hand, paired", "variant": "paired_tp",
         "value": f"{paired['hasten_s'] * 1e3:.0f} vs {paired['torch_s'] * 1e3:.0f} ms ({paired['pairs']} pairs)",
         "ratio": paired["median_ratio"]},
    ]


def pipeline_rows(pipeline: dict) -> list:
    """One row per m: measured step / ideal (median of the per-step ratios), measured and theoretical bubble."""
    rows = []
    for row in pipeline["rows"]:
        m = row["m"]
        theory = (PP_STAGES - 1) / (m + PP_STAGES - 1)
        row.update(bubble=1 - row["ideal_over_measured"], bubble_theory=theory,
                   speedup=pipeline["one_process_s"] / row["measured_s"],
                   speedup_theory=PP_STAGES * m / (m + PP_STAGES - 1))
        rows.append({"benchmark": f"GPipe 2 stages, m={m}: step vs same work alone", "variant": "pipeline",
                     "value": f"{row['measured_s'] * 1e3:.0f} vs {row['ideal_s'] * 1e3:.0f} ms; bubble "
                              f"{row['bubble']:.2f} (theory {theory:.2f})", "ratio": 1 / row["ideal_over_measured"]})
    return rows


def pipeline_table(pipeline: dict) -> str:
    lines = [f"GPipe, {PP_STAGES} stages x {PP_BLOCKS // PP_STAGES} blocks, batch {PP_BATCH}, medians of "
             f"{pipeline['rows'][0]['steps']} steps; whole model on one process (forward + backward, whole batch): "
             f"{pipeline['one_process_s'] * 1e3:.0f} ms",
             f"{'m':>2} {'micro':>5} {'measured':>9} {'ideal':>8} {'per mb (stage 0, 1)':>20} "
             f"{'bubble':>7} {'theory':>7} {'speedup':>8} {'theory':>7}"]
    for row in pipeline["rows"]:
        each = ", ".join(f"{value * 1e3:.0f}" for value in row["stage_each_s"])
        lines.append(f"{row['m']:>2} {PP_BATCH // row['m']:>5} {row['measured_s'] * 1e3:>6.0f} ms "
                     f"{row['ideal_s'] * 1e3:>5.0f} ms {each + ' ms':>20} {row['bubble']:>7.2f} "
                     f"{row['bubble_theory']:>7.2f} {row['speedup']:>7.2f}x {row['speedup_theory']:>6.2f}x")
    return "\n".join(lines)


def main(argv=None) -> list:
    argv = list(sys.argv[1:] if argv is None else argv)
    results = {variant: launch_worker(__file__, variant) for variant in VARIANTS}
    rows = report(tensor_parallel_rows(results) + pipeline_rows(results["pipeline"]), argv, widths=(50, 40))
    print(pipeline_table(results["pipeline"]), flush=True)
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        variant, out = sys.argv[2], Path(sys.argv[3])
        if variant == "paired_tp":
            paired_worker(out)
        elif variant == "pipeline":
            pipeline_worker(out)
        else:
            memory_worker(variant, out)
    else:
        main()
