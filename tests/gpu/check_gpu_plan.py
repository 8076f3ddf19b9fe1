"""The GPU check of ``hasten plan``: its predicted peak per layout against what the CUDA allocator counts.

A ~1B Llama (``gpu_common.LLAMA_1B``; the dry run: ``LLAMA_TINY``), bf16 autocast, AdamW, micro-batch 1 at sequence
1024 (dry run: 32), is trained three steps through hasten on one GPU as each layout the plan offers a single device
runs: DDP of one (the ``ddp`` row: plain data parallelism, no buckets at one process), FSDP2 over the model's blocks
and, with DeepSpeed installed, ZeRO-3. Before each layout the allocator's peak is reset; after it,
``torch.cuda.max_memory_allocated`` is compared with the plan's peak for that row. The loss is the one the plan
traces for a model without its own loss: the sum of the logits in float32.

Reported per layout: the predicted and the measured peak, their relative difference, the allocator's overhead
(``max_memory_reserved - max_memory_allocated``: the rounding and caching a GPU adds to the live tensors) and the
CUDA context (the device's used memory, ``torch.cuda.mem_get_info``, less what the allocator reserved). The last two
are what ``--reserve`` should hold (docs/plan.md). The check fails when a prediction is off by more than
``TOLERANCE`` of the measurement.
"""
from __future__ import annotations

import importlib.util

import torch
from gpu_common import LLAMA_1B, LLAMA_TINY, Ctx, build_llama, token_batches

TOLERANCE = 0.10
STEPS = 3


def _sizes(ctx: Ctx) -> tuple:
    return (LLAMA_TINY, 32) if ctx.dry_run else (LLAMA_1B, 1024)


def _planned(config, seq: int) -> dict:
    """The plan's peak per layout of one process (bytes)."""
    from hasten.planning import plan
    from hasten.planning.model_source import factory_source

    def batch(micro_batch_size: int, seq_len: int) -> torch.Tensor:
        return torch.randint(0, config.vocab, (micro_batch_size, seq_len))

    source = factory_source(lambda: build_llama(config), batch, name="llama")  # built on fake tensors
    result = plan(source, seq_len=seq, micro_batch_size=1, num_processes=1, gpu_memory=2 ** 50,
                  mixed_precision="bf16", layouts=["ddp", "fsdp2", "zero"])
    return {name: result.row(name).peak for name in ("ddp", "fsdp2", "zero3")}


def _accelerator(layout: str):
    from hasten import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin

    if layout == "fsdp2":
        return Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]))
    if layout == "zero3":
        plugin = DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=1)
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1  # no loader is prepared
        return Accelerator(mixed_precision="bf16", deepspeed_plugin=plugin)
    return Accelerator(mixed_precision="bf16")


def _measured(ctx: Ctx, layout: str, config, seq: int) -> dict:
    """Three steps of ``layout``; the allocator's peak, its overhead and the CUDA context (bytes)."""
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    accelerator = _accelerator(layout)
    model = build_llama(config, seed=0, device=ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    for tokens in token_batches(STEPS, 1, seq, config.vocab, ctx.device):
        with accelerator.autocast():
            loss = model(tokens[:, :-1]).float().sum()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out = {"allocated": torch.cuda.max_memory_allocated(),
           "allocator_overhead": torch.cuda.max_memory_reserved() - torch.cuda.max_memory_allocated(),
           "cuda_context": (total - free) - torch.cuda.memory_reserved()}
    del model, optimizer, loss
    accelerator.free_memory()
    return out


def plan_vs_allocated(ctx: Ctx) -> dict:
    """The plan's peak for DDP of one, FSDP2 and ZeRO-3 against ``torch.cuda.max_memory_allocated``."""
    config, seq = _sizes(ctx)
    predicted = _planned(config, seq)
    if ctx.dry_run or not torch.cuda.is_available():
        return {"detail": "planned " + ", ".join(f"{k} {v / 2 ** 20:.1f} MiB" for k, v in predicted.items()) +
                          " (the allocator is measured on a GPU only)", "metrics": {"predicted": predicted}}
    ctx.world_of_one()
    layouts = ["ddp", "fsdp2"] + (["zero3"] if importlib.util.find_spec("deepspeed") is not None else [])
    rows = {}
    for layout in layouts:
        measured = _measured(ctx, layout, config, seq)
        error = (predicted[layout] - measured["allocated"]) / measured["allocated"]
        rows[layout] = {"predicted": predicted[layout], **measured, "relative_error": error}
    worst = max(abs(row["relative_error"]) for row in rows.values())
    detail = "; ".join(f"{name} plan {row['predicted'] / 2 ** 30:.2f} GiB vs allocated "
                       f"{row['allocated'] / 2 ** 30:.2f} GiB ({row['relative_error']:+.1%}), allocator +"
                       f"{row['allocator_overhead'] / 2 ** 20:.0f} MiB, context {row['cuda_context'] / 2 ** 20:.0f} MiB"
                       for name, row in rows.items())
    if len(rows) < 3:
        detail += " (ZeRO-3 not measured: deepspeed is not installed)"
    result = {"detail": detail, "metrics": rows}
    if worst > TOLERANCE:
        result["failed"] = f"a prediction is {worst:.1%} off the allocator's peak (tolerance {TOLERANCE:.0%}): {detail}"
    return result
