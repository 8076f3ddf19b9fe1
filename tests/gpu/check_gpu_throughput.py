"""The throughput check: a ~1B-parameter Llama-style model (gpu_common.LLAMA_1B, built from its config), sequence
2048, bf16, FSDP2 on one GPU with regional compilation, trained through the library and, in the same process and in
turns, by hand in plain PyTorch (the same model, data, optimizer and loop). The hasten variant measures hasten
against plain; the reference variant, in its own process, the reference library against plain.

While hasten refuses FSDP on one process, the hasten variant records the refusal (the check fails with it) and
measures the single-device layout instead (bf16 autocast + regional compile, no FSDP), and the reference variant
measures that layout too, so the run still yields comparable figures.
"""
from __future__ import annotations

import time

import torch
from gpu_common import LLAMA_1B, LLAMA_TINY, Ctx, alternate, build_llama, count_parameters, lm_loss, token_batches

GPU_SIZES = dict(config=LLAMA_1B, seq=2048, batch=4, warmup=2, windows=5, steps=6)   # 30 timed steps per loop
DRY_SIZES = dict(config=LLAMA_TINY, seq=64, batch=2, warmup=1, windows=3, steps=1)   # 3 timed steps


def _mp_policy():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _accelerator(ctx: Ctx, layout: str, backend: str):
    """The library's Accelerator for the layout: bf16, regional compilation, FSDP2 per block (``fsdp2``)."""
    lib = ctx.library()
    utils = __import__(f"{lib.__name__}.utils", fromlist=["TorchDynamoPlugin"])
    options = dict(mixed_precision="bf16",
                   dynamo_plugin=utils.TorchDynamoPlugin(backend=backend, use_regional_compilation=True))
    if layout == "fsdp2":
        options["fsdp_plugin"] = lib.FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"],
            mixed_precision_policy=_mp_policy(), reshard_after_forward=True)
    return lib.Accelerator(**options)


def _plain_model(ctx: Ctx, config, layout: str, backend: str):
    """The model prepared by hand, in torchtitan's order: compile each block, then fully_shard each block and the
    root on a one-device mesh (``fsdp2``); or only the compiled blocks (``single``)."""
    model = build_llama(config, seed=0, device=ctx.device)
    for block in model.layers:
        block.compile(backend=backend)
    if layout == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if ctx.device == "cuda" else "gloo")
        mesh = init_device_mesh(torch.device(ctx.device).type, (1,))
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=_mp_policy(), reshard_after_forward=True)
        fully_shard(model, mesh=mesh, mp_policy=_mp_policy(), reshard_after_forward=True)
    return model


class LMLoop:
    """Next-token training steps over fixed batches; the losses stay on the device until read (no sync per step)."""

    def __init__(self, model, optimizer, batches, device, backward=None):
        self.model, self.optimizer, self.batches, self.backward = model, optimizer, batches, backward
        self.device_type, self.index, self.losses = torch.device(device).type, 0, []

    def __call__(self, steps: int) -> None:
        for _ in range(steps):
            tokens = self.batches[self.index % len(self.batches)]
            if self.backward is None:  # by hand: autocast around the forward, as the library does
                with torch.autocast(self.device_type, dtype=torch.bfloat16):
                    logits = self.model(tokens[:, :-1])
                loss = lm_loss(logits, tokens)
                loss.backward()
            else:
                loss = lm_loss(self.model(tokens[:, :-1]), tokens)
                self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.losses.append(loss.detach())
            self.index += 1


def throughput(ctx: Ctx) -> dict:
    """tokens/s of the library's loop and of the hand-written one, in alternating windows of the same process."""
    sizes = DRY_SIZES if ctx.dry_run else GPU_SIZES
    config, seq, batch = sizes["config"], sizes["seq"], sizes["batch"]
    backend = "eager" if ctx.dry_run else "inductor"
    layout = ctx.inputs.get("layout", "fsdp2")
    ctx.world_of_one() if layout == "fsdp2" else ctx.no_launcher()
    refusal = None
    try:
        accelerator = _accelerator(ctx, layout, backend)
    except Exception as error:  # FSDP on one process refused: measure one device instead
        if ctx.variant != "hasten" or layout != "fsdp2":
            raise
        from hasten.state import AcceleratorState

        refusal, layout = f"{type(error).__name__}: {error}", "single"
        ctx.say("FSDP2 refused, measuring the single-device layout:", refusal)
        AcceleratorState._reset_state(reset_partial_state=True)
        ctx.no_launcher()
        accelerator = _accelerator(ctx, layout, backend)
    batches = token_batches(4, batch, seq, config.vocab, ctx.device)
    model = build_llama(config, seed=0, device=ctx.device)
    params = count_parameters(model)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    plain = _plain_model(ctx, config, layout, backend)
    loops = {ctx.variant: LMLoop(model, optimizer, batches, ctx.device, backward=accelerator.backward),
             "plain": LMLoop(plain, torch.optim.AdamW(plain.parameters(), lr=1e-4), batches, ctx.device)}
    warmup_s = {}
    for name, loop in loops.items():
        started = time.perf_counter()
        loop(sizes["warmup"])  # the first step compiles
        float(loop.losses[-1])
        warmup_s[name] = time.perf_counter() - started
    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timings = alternate(loops, sizes["windows"], sizes["steps"], ctx.device)
    first = {name: float(loop.losses[0]) for name, loop in loops.items()}
    gap = abs(first[ctx.variant] - first["plain"]) / abs(first["plain"])
    assert gap < 5e-2, f"first losses {first}: the two loops do not compute the same thing"
    tokens = batch * seq
    rates = {name: tokens * sizes["steps"] * len(t) / sum(t) for name, t in timings.items()}
    result = {
        "detail": f"{layout}, {params / 1e6:,.1f}M parameters (6N FLOPs/token), batch {batch} x seq {seq}, "
                  f"{sizes['windows']}x{sizes['steps']} timed steps per loop: {ctx.variant} "
                  f"{rates[ctx.variant]:.0f} tokens/s, plain {rates['plain']:.0f} tokens/s",
        "timings": timings, "steps_per_window": sizes["steps"], "tokens_per_step": tokens, "params": params,
        "metrics": {"layout": layout, "backend": backend, "warmup_s": warmup_s, "first_loss": first,
                    "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if ctx.device == "cuda" else None},
        "for_reference": {"layout": layout},
    }
    if refusal:
        result["failed"] = f"FSDP2 on one process refused (figures are for one device without FSDP): {refusal}"
    return result
