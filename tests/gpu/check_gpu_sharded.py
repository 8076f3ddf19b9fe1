"""GPU checks of the sharded strategies on one process: FSDP2, FSDP1, FSDP2 with CPU offload, and DeepSpeed ZeRO-2 /
ZeRO-3 (through check_gpu_deepspeed.py). Until hasten accepts FSDP on one process, the FSDP checks fail at the
Accelerator's construction with hasten's message: that is what the GPU run must show."""
from __future__ import annotations

from pathlib import Path

import torch
from gpu_common import LLAMA_TINY, Ctx, build_llama, lm_loss, sized, token_batches



def _sizes(ctx: Ctx):
    if ctx.dry_run:
        return LLAMA_TINY, 32, 2
    return sized(LLAMA_TINY, vocab=1024, dim=256, layers=2, heads=4, kv_heads=2, ffn=704), 128, 4


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """The shard a process holds (a DTensor's local tensor under FSDP2)."""
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter


def _train(accelerator, model, optimizer, batches, steps: range) -> list:
    losses = []
    for index in steps:
        tokens = batches[index % len(batches)]
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _plain_losses(ctx: Ctx, config, batches, steps: int) -> list:
    """The unsharded model, trained by hand (bf16 autocast) on the same batches: what sharding must not change."""
    model = build_llama(config, seed=0, device=ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for index in range(steps):
        tokens = batches[index % len(batches)]
        with torch.autocast(torch.device(ctx.device).type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = lm_loss(logits, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _prepared(ctx: Ctx, config, plugin_options: dict):
    from hasten import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(**plugin_options))
    model = build_llama(config, seed=0, device=ctx.device)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    return accelerator, model, optimizer


def _close(ours: list, plain: list, what: str, tolerance: float = 2e-2) -> float:
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, plain))
    assert worst < tolerance, f"{what}: losses {ours} vs the unsharded model's {plain}"
    return worst


def _save_and_resume(ctx: Ctx, plugin_options: dict, async_save: bool) -> dict:
    """Train ``total`` steps saving after ``save_at`` (asynchronously: training goes on while it is written), then
    resume in a fresh Accelerator: the steps after the save give the same losses and weights, bitwise."""
    from hasten.state import AcceleratorState

    ctx.world_of_one()
    config, seq, batch = _sizes(ctx)
    total, save_at = (4, 2) if ctx.dry_run else (8, 4)
    batches = token_batches(4, batch, seq, config.vocab, ctx.device)
    accelerator, model, optimizer = _prepared(ctx, config, plugin_options)
    devices = {_local(p).device.type for p in model.parameters()}
    assert devices == {torch.device(ctx.device).type}, f"parameters on {devices}, expected {ctx.device}"
    folder = Path(ctx.work_dir) / "checkpoint"
    before = _train(accelerator, model, optimizer, batches, range(save_at))
    accelerator.save_state(str(folder), async_save=async_save)
    after = _train(accelerator, model, optimizer, batches, range(save_at, total))  # overlaps the write
    accelerator.wait_for_checkpoint()
    weights = {k: v.detach().float().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert any(name.endswith(".metadata") for name in files), f"no sharded (DCP) checkpoint in {files}"
    worst = _close(before + after, _plain_losses(ctx, config, batches, total), "sharded training")
    AcceleratorState._reset_state()
    accelerator, model, optimizer = _prepared(ctx, config, plugin_options)
    accelerator.load_state(str(folder))
    resumed = _train(accelerator, model, optimizer, batches, range(save_at, total))
    assert resumed == after, f"resumed losses {resumed} vs {after}"
    resumed_weights = accelerator.get_state_dict(model)
    differing = [k for k in weights if not torch.equal(weights[k], resumed_weights[k].detach().float().cpu())]
    assert not differing, f"weights after the resume differ: {differing[:5]}"
    return {"detail": f"{total} steps ({before[0]:.4f} -> {after[-1]:.4f}, within {worst:.1e} of unsharded), "
                      f"{'async ' if async_save else ''}sharded save of {len(files)} files at step {save_at}, "
                      "resume bitwise",
            "metrics": {"losses": before + after, "max_rel_diff_vs_unsharded": worst, "checkpoint_files": files}}


def fsdp2(ctx: Ctx) -> dict:
    """FSDP2 (``fully_shard`` per block) on one process: trains like the unsharded model, a sharded checkpoint
    saved asynchronously from device tensors, and an exact resume."""
    return _save_and_resume(ctx, dict(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                      transformer_cls_names_to_wrap=["Block"], state_dict_type="SHARDED_STATE_DICT"),
                            async_save=True)


def fsdp1(ctx: Ctx) -> dict:
    """FSDP1 (``FullyShardedDataParallel`` with nested units) on one process: trains, saves, resumes exactly."""
    return _save_and_resume(ctx, dict(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                                      transformer_cls_names_to_wrap=["Block"], state_dict_type="SHARDED_STATE_DICT",
                                      use_orig_params=True), async_save=False)


def fsdp2_cpu_offload(ctx: Ctx) -> dict:
    """FSDP2 with ``cpu_offload=True``: the shards live in CPU memory, pinned when a GPU exists, and training gives
    the unsharded model's losses."""
    ctx.world_of_one()
    config, seq, batch = _sizes(ctx)
    batches = token_batches(4, batch, seq, config.vocab, ctx.device)
    accelerator, model, optimizer = _prepared(ctx, config, dict(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"],
        cpu_offload=True))
    shards = [_local(p) for p in model.parameters()]
    devices = {s.device.type for s in shards}
    assert devices == {"cpu"}, f"offloaded shards on {devices}"
    pinned = sum(s.is_pinned() for s in shards)
    expect_pinned = torch.cuda.is_available()
    assert (pinned == len(shards)) if expect_pinned else pinned == 0, f"{pinned} of {len(shards)} shards pinned"
    losses = _train(accelerator, model, optimizer, batches, range(4))
    worst = _close(losses, _plain_losses(ctx, config, batches, 4), "offloaded training")
    return {"detail": f"{len(shards)} shards on the CPU, {pinned} pinned; 4 steps {losses[0]:.4f} -> {losses[-1]:.4f}, "
                      f"within {worst:.1e} of unsharded",
            "metrics": {"shards": len(shards), "pinned": pinned, "max_rel_diff_vs_unsharded": worst}}


def deepspeed_zero(ctx: Ctx) -> dict:
    """DeepSpeed ZeRO-2 with fp16 (its dynamic loss scaler) and ZeRO-3 with bf16 on one GPU: training, a save after
    8 steps, and a resume that gives the same losses and weights bitwise (check_gpu_deepspeed.py)."""
    from check_gpu_deepspeed import check_stage

    ctx.world_of_one()
    lines = [check_stage(stage, precision, Path(ctx.work_dir)) for stage, precision in ((2, "fp16"), (3, "bf16"))]
    return {"detail": "; ".join(lines)}
