"""GPU checks of the training loop on one device: mixed precision (bf16, fp16 + scaler, fp8), torch.compile and
regional compilation, and a process group on a world of one. Each function runs in a process of its own
(gpu_checks.py) and returns its figures; an assertion that fails is the check's failure."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from gpu_common import (
    LLAMA_TINY,
    Ctx,
    alternate,
    build_llama,
    build_mlp,
    lm_loss,
    regression_batches,
    sized,
    token_batches,
)


def _sizes(ctx: Ctx, gpu: tuple, cpu: tuple) -> tuple:
    return cpu if ctx.dry_run else gpu


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


class Loop:
    """A training loop over a fixed list of batches, one step at a time, so that two loops can take turns
    (``gpu_common.alternate``) and still see the same batches in the same order."""

    def __init__(self, step, batches):
        self.step_fn, self.batches, self.index, self.losses = step, batches, 0, []

    def __call__(self, steps: int) -> None:
        for _ in range(steps):
            loss = self.step_fn(self.index, *self.batches[self.index % len(self.batches)])
            self.losses.append(loss.detach())
            self.index += 1

    def values(self) -> list:
        return [float(v) for v in self.losses]


def _mse_steps(ctx, model, optimizer, backward=None, autocast_dtype=None, scaler=None, scheduler=None,
               overflow_at=None, log=None):
    """The step function of a hand-written (plain PyTorch) loop, or of a library's loop when ``backward`` is the
    accelerator's ``backward`` (the library then does autocast and scaling itself)."""
    device_type = torch.device(ctx.device).type

    def step(index, x, y):
        if autocast_dtype is not None:
            with torch.autocast(device_type, dtype=autocast_dtype):
                out = model(x)
        else:
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        scaled = loss * math.inf if index == overflow_at else loss  # an overflow: every gradient is inf or nan
        if backward is not None:
            backward(scaled)
            optimizer.step()
            skipped = bool(getattr(optimizer, "step_was_skipped", False))
        elif scaler is not None:
            scaler.scale(scaled).backward()
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped = scaler.get_scale() < before
        else:
            scaled.backward()
            optimizer.step()
            skipped = False
        if scheduler is not None and (backward is not None or not skipped):
            scheduler.step()  # a prepared scheduler holds by itself on a skipped step
        optimizer.zero_grad(set_to_none=True)
        if log is not None:
            log.append((index, skipped, scheduler.get_last_lr()[0] if scheduler is not None else None))
        return loss

    return step


def amp_bf16(ctx: Ctx) -> dict:
    """bf16 autocast through the library gives the losses of ``torch.autocast`` by hand, at the same step time."""
    ctx.no_launcher()
    lib = ctx.library()
    width, depth, batch, windows, steps = _sizes(ctx, (1024, 4, 256, 6, 20), (64, 2, 16, 3, 2))
    batches = regression_batches(8, batch, width, ctx.device)
    accelerator = lib.Accelerator(mixed_precision="bf16")
    model = build_mlp(width, depth, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator.device.type == torch.device(ctx.device).type, accelerator.device
    plain = build_mlp(width, depth, seed=0, device=ctx.device)
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    loops = {ctx.variant: Loop(_mse_steps(ctx, model, optimizer, backward=accelerator.backward), batches),
             "plain": Loop(_mse_steps(ctx, plain, plain_optimizer, autocast_dtype=torch.bfloat16), batches)}
    for loop in loops.values():
        loop(3)  # warm-up
    timings = alternate(loops, windows, steps, ctx.device)
    ours, theirs = loops[ctx.variant].values(), loops["plain"].values()
    diff = max(abs(a - b) for a, b in zip(ours, theirs))
    assert all(math.isfinite(v) for v in ours), ours
    assert diff <= 1e-3 * max(abs(v) for v in theirs), f"losses differ from torch.autocast by hand: {ours} vs {theirs}"
    return {"detail": f"{len(ours)} steps on {ctx.device}: loss {ours[0]:.4f} -> {ours[-1]:.4f}, "
                      f"max |{ctx.variant} - plain| {diff:.1e}",
            "timings": timings, "steps_per_window": steps,
            "metrics": {"max_loss_diff": diff, "first_loss": ours[0], "last_loss": ours[-1]}}


def amp_fp16(ctx: Ctx) -> dict:
    """fp16 with the gradient scaler: the step with an overflow is skipped (``step_was_skipped``), the prepared
    scheduler holds on it, the scale halves, and the weights end equal to a hand-written GradScaler loop's."""
    ctx.no_launcher()
    lib = ctx.library()
    width, depth, batch, windows, steps = _sizes(ctx, (1024, 4, 256, 6, 20), (64, 2, 16, 3, 2))
    overflow_at, warmup = 3, 6
    batches = regression_batches(8, batch, width, ctx.device)
    accelerator = lib.Accelerator(mixed_precision="fp16")
    model = build_mlp(width, depth, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    plain = build_mlp(width, depth, seed=0, device=ctx.device)
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=1e-2, momentum=0.9)
    plain_scheduler = torch.optim.lr_scheduler.StepLR(plain_optimizer, step_size=1, gamma=0.9)
    scaler = torch.amp.GradScaler(torch.device(ctx.device).type)
    ours_log, plain_log = [], []
    scale_before = accelerator.scaler.get_scale() if getattr(accelerator, "scaler", None) else None
    loops = {ctx.variant: Loop(_mse_steps(ctx, model, optimizer, backward=accelerator.backward, scheduler=scheduler,
                                          overflow_at=overflow_at, log=ours_log), batches),
             "plain": Loop(_mse_steps(ctx, plain, plain_optimizer, autocast_dtype=torch.float16, scaler=scaler,
                                      scheduler=plain_scheduler, overflow_at=overflow_at, log=plain_log), batches)}
    for loop in loops.values():
        loop(warmup)  # the overflow happens here, untimed
    skipped = [index for index, was_skipped, _ in ours_log if was_skipped]
    assert skipped == [overflow_at], f"steps reported skipped: {skipped}, expected [{overflow_at}]"
    lrs = [lr for _, _, lr in ours_log]
    assert lrs[overflow_at] == lrs[overflow_at - 1], f"the scheduler stepped on the skipped step: {lrs}"
    assert lrs[overflow_at + 1] < lrs[overflow_at], f"the scheduler did not step after it: {lrs}"
    assert lrs == [lr for _, _, lr in plain_log], f"learning rates {lrs} vs the hand-written loop {plain_log}"
    scale_after = accelerator.scaler.get_scale() if getattr(accelerator, "scaler", None) else None
    timings = alternate(loops, windows, steps, ctx.device)
    ours_params = dict(accelerator.unwrap_model(model).named_parameters())
    weight_diff = max((p.detach().float() - ours_params[n].detach().float()).abs().max().item()
                      for n, p in plain.named_parameters())
    assert weight_diff <= 1e-3, f"weights differ from the hand-written GradScaler loop by {weight_diff}"
    ours = loops[ctx.variant].values()
    return {"detail": f"{len(ours)} steps, overflow at step {overflow_at} skipped, lr held "
                      f"({lrs[overflow_at - 1]:.4g} -> {lrs[overflow_at]:.4g} -> {lrs[overflow_at + 1]:.4g}), "
                      f"scale {scale_before} -> {scale_after}, max |weights - plain| {weight_diff:.1e}",
            "timings": timings, "steps_per_window": steps,
            "metrics": {"skipped_steps": skipped, "max_weight_diff": weight_diff, "scale_before": scale_before,
                        "scale_after": scale_after}}


def fp8_torchao(ctx: Ctx) -> dict:
    """fp8 training through torchao's float8 layers: the loss over 50 steps stays close to bf16's, and equals that of
    ``convert_to_float8_training`` by hand."""
    from torchao.float8 import convert_to_float8_training

    ctx.no_launcher()
    lib = ctx.library()
    # 50 steps; widths are multiples of 16 (the CPU sizes serve to try the logic by hand: the dry run skips fp8)
    width, depth, batch, windows, steps = _sizes(ctx, (1024, 4, 512, 5, 10), (64, 2, 32, 5, 10))
    batches = regression_batches(10, batch, width, ctx.device)
    accelerator = lib.Accelerator(mixed_precision="fp8")
    model = build_mlp(width, depth, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    fp8_layers = sum(type(m).__name__ == "Float8Linear" for m in accelerator.unwrap_model(model).modules())
    assert fp8_layers > 0, "no Float8Linear layer in the prepared model"
    plain = convert_to_float8_training(build_mlp(width, depth, seed=0, device=ctx.device))
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    bf16 = build_mlp(width, depth, seed=0, device=ctx.device)
    bf16_optimizer = torch.optim.AdamW(bf16.parameters(), lr=1e-3)
    loops = {ctx.variant: Loop(_mse_steps(ctx, model, optimizer, backward=accelerator.backward), batches),
             "plain": Loop(_mse_steps(ctx, plain, plain_optimizer, autocast_dtype=torch.bfloat16), batches)}
    timings = alternate(loops, windows, steps, ctx.device)
    bf16_loop = Loop(_mse_steps(ctx, bf16, bf16_optimizer, autocast_dtype=torch.bfloat16), batches)
    bf16_loop(windows * steps)
    ours, theirs, reference = loops[ctx.variant].values(), loops["plain"].values(), bf16_loop.values()

    def tail(values):
        return sum(values[-10:]) / 10

    gap = _relative(tail(ours), tail(reference))
    assert ours[-1] < ours[0], f"fp8 loss did not go down: {ours[0]} -> {ours[-1]}"
    assert gap < 0.10, f"fp8 loss of the last 10 steps {tail(ours):.4f} vs bf16 {tail(reference):.4f}"
    same = max(_relative(a, b) for a, b in zip(ours, theirs))
    assert same < 2e-2, f"losses differ from torchao by hand by {same:.2e} (relative)"
    return {"detail": f"{fp8_layers} Float8Linear layers, 50 steps: fp8 {ours[0]:.4f} -> {ours[-1]:.4f}, bf16 -> "
                      f"{reference[-1]:.4f} (last-10 gap {100 * gap:.2f}%), max rel |{ctx.variant} - torchao by hand| "
                      f"{same:.1e}",
            "timings": timings, "steps_per_window": steps,
            "metrics": {"fp8_layers": fp8_layers, "last10_gap_vs_bf16": gap, "max_rel_diff_vs_plain": same}}


def compile_full_and_regional(ctx: Ctx) -> dict:
    """``TorchDynamoPlugin`` compiles the whole model (against ``torch.compile`` by hand) and, with
    ``use_regional_compilation``, each block in place (against ``block.compile()`` by hand): the first losses equal
    eager ones, the compile times and step times are reported side by side."""
    import time

    from hasten import Accelerator, TorchDynamoPlugin
    from hasten.state import AcceleratorState

    ctx.no_launcher()
    config, seq, batch, windows, steps = _sizes(
        ctx, (sized(LLAMA_TINY, vocab=4096, dim=512, layers=4, heads=8, kv_heads=4, ffn=1408), 256, 8, 6, 10),
        (LLAMA_TINY, 32, 2, 3, 1))
    backend = "eager" if ctx.dry_run else "inductor"  # dynamo's tracing on the CPU, without minutes of codegen
    batches = [(b,) for b in token_batches(4, batch, seq, config.vocab, ctx.device)]

    def loop(model, optimizer=None, backward=None):
        optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
        return Loop(lambda index, tokens: _lm_step(model, optimizer, backward, tokens, ctx.device), batches)

    eager = loop(build_llama(config, seed=0, device=ctx.device))
    eager(2)
    timings, compile_s, first = {}, {}, {}
    for regional in (False, True):
        AcceleratorState._reset_state()
        accelerator = Accelerator(mixed_precision="bf16", dynamo_plugin=TorchDynamoPlugin(
            backend=backend, use_regional_compilation=regional))
        model = build_llama(config, seed=0, device=ctx.device)
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        plain = build_llama(config, seed=0, device=ctx.device)
        if regional:
            for block in plain.layers:
                block.compile(backend=backend)
            blocks = accelerator.unwrap_model(model).layers
            compiled = sum(getattr(b, "_compiled_call_impl", None) is not None for b in blocks)
            assert compiled == len(blocks), f"{compiled} of {len(blocks)} blocks compiled in place"
        suffix = "_regional" if regional else ""
        pair = {"hasten" + suffix: loop(model, optimizer, accelerator.backward),
                "plain" + suffix: loop(plain if regional else torch.compile(plain, backend=backend))}
        for name, each in pair.items():
            started = time.perf_counter()
            each(2)  # compiles forward and backward
            compile_s[name] = time.perf_counter() - started
            first[name] = each.values()[:2]
        timings.update(alternate(pair, windows, steps, ctx.device))
    reference = eager.values()
    worst = max(_relative(a, b) for values in first.values() for a, b in zip(values, reference))
    assert worst < 2e-2, f"compiled losses {first} vs eager {reference}"
    return {"detail": f"{backend}: first losses within {worst:.1e} (relative) of eager; compile s "
                      + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items()),
            "timings": timings, "steps_per_window": steps,
            "pairs": {"hasten/plain": ["hasten", "plain"],
                      "hasten_regional/plain_regional": ["hasten_regional", "plain_regional"]},
            "metrics": {"compile_s": compile_s, "max_rel_diff_vs_eager": worst}}


def _lm_step(model, optimizer, backward, tokens, device):
    if backward is None:  # by hand: autocast around the forward
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
    else:
        logits = model(tokens[:, :-1])
    loss = lm_loss(logits, tokens)
    (backward or torch.Tensor.backward)(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def nccl_world_of_one(ctx: Ctx) -> dict:
    """A world of one (the environment a launcher gives rank 0): the process group (NCCL on CUDA) is initialised,
    torch.distributed's collectives run on device tensors, and hasten's collectives (``gather``, ``reduce``,
    ``broadcast``, ``pad_across_processes``, ``gather_object``, ``gather_for_metrics``) return what a world of one
    must: their input."""
    import torch.distributed as dist

    ctx.world_of_one()
    from hasten import Accelerator, PartialState
    from hasten.utils import broadcast, gather, gather_object, pad_across_processes, reduce

    first = PartialState()
    seen_alone = {"distributed_type": str(first.distributed_type), "backend": first.backend}
    backend = "nccl" if ctx.device == "cuda" else "gloo"
    if not dist.is_initialized():  # a script that initialises its process group itself, as torchrun scripts do
        options = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, **options)
    assert dist.get_backend() == backend and dist.get_world_size() == 1, (dist.get_backend(), dist.get_world_size())
    PartialState._reset_state()
    accelerator = Accelerator()
    seen = {"distributed_type": str(accelerator.state.distributed_type), "backend": accelerator.state.backend,
            "device": str(accelerator.device)}
    x = torch.arange(12, dtype=torch.float32, device=accelerator.device).reshape(3, 4)
    for name, value in (("gather", gather(x)), ("reduce sum", reduce(x, "sum")), ("reduce mean", reduce(x, "mean")),
                        ("broadcast", broadcast(x.clone())), ("pad_across_processes", pad_across_processes(x)),
                        ("gather_for_metrics", accelerator.gather_for_metrics(x))):
        assert torch.equal(value.cpu(), x.cpu()), f"{name} on a world of one: {value} vs {x}"
        assert value.device.type == x.device.type, f"{name} moved the tensor to {value.device}"
    assert gather_object([{"rank": 0}]) == [{"rank": 0}], gather_object([{"rank": 0}])
    y = x.clone()
    dist.all_reduce(y)
    gathered = torch.empty(1 * x.numel(), device=x.device)
    dist.all_gather_into_tensor(gathered, x.flatten())
    scattered = torch.empty(x.numel(), device=x.device)
    dist.reduce_scatter_tensor(scattered, x.flatten())
    dist.broadcast(y, src=0)
    dist.barrier()
    assert torch.equal(y, x) and torch.equal(gathered, x.flatten()) and torch.equal(scattered, x.flatten())
    return {"detail": f"{backend} world of one on {seen['device']}: torch.distributed and hasten collectives exact; "
                      f"hasten alone saw {seen_alone['distributed_type']} (backend {seen_alone['backend']}), with the "
                      f"group up {seen['distributed_type']} (backend {seen['backend']})",
            "metrics": {"backend": backend, "hasten_alone": seen_alone, "hasten_with_group": seen}}
