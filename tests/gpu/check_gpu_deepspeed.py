"""GPU checks of the DeepSpeed strategy, for a machine with one CUDA GPU (none of the CPU tests needs one).

    python tests/gpu/check_gpu_deepspeed.py OUT_DIR      # one process, no launcher needed
    (bash tests/gpu/run_all.sh runs ZeRO-2 fp16 and ZeRO-3 bf16 of it as its check "deepspeed")

What the CPU cannot show: fp16 with DeepSpeed's dynamic loss scaler (refused on CPUs), bf16 and ZeRO-3 on CUDA, and
an exact resume there. Each check prints ``ok: ...``; the last line is ``GPU DEEPSPEED CHECKS PASSED``. A failure
raises with what differed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DeepSpeedPlugin
from hasten.state import AcceleratorState
from hasten.utils import set_seed


def data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, 64, generator=generator), torch.randn(256, 8, generator=generator))


def run(stage: int, precision: str, folder: Path, steps: int, resume: bool = False):
    AcceleratorState._reset_state()
    accelerator = Accelerator(mixed_precision=precision, gradient_accumulation_steps=2,
                              deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    set_seed(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    engine, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                                    DataLoader(data(), batch_size=8))
    assert engine.device.type == "cuda", engine.device
    if resume:
        accelerator.load_state(folder)
        loader = accelerator.skip_first_batches(loader, steps)
    losses, skipped = [], 0
    for index, (x, y) in enumerate(loader):
        if not resume and index == steps:
            accelerator.save_state(folder)
        with accelerator.accumulate(engine):
            loss = nn.functional.mse_loss(engine(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(engine.parameters(), 1.0)
            optimizer.step()
            skipped += int(optimizer.step_was_skipped)
            optimizer.zero_grad()
        losses.append(loss.item())
    # the fp32 master weights where the strategy exposes them (its attribute may move), else the full state dict
    master = getattr(accelerator.strategy, "master_model_state_dict", None)
    weights = master(engine) if callable(master) else accelerator.get_state_dict(engine)
    return losses, skipped, {k: v.detach().float().cpu() for k, v in weights.items()}


def check_stage(stage: int, precision: str, out: Path, steps: int = 8) -> str:
    """Train, save after ``steps`` steps, resume in a fresh Accelerator: the same losses and weights, bitwise."""
    folder = out / f"zero{stage}_{precision}"
    losses, skipped, weights = run(stage, precision, folder, steps=steps)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    tail, _, resumed_weights = run(stage, precision, folder, steps=steps, resume=True)
    assert tail == losses[steps:], f"ZeRO-{stage} {precision}: resumed losses {tail} vs {losses[steps:]}"
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights), f"ZeRO-{stage} {precision} weights"
    return (f"ZeRO-{stage} {precision} on CUDA trains ({losses[0]:.3f} -> {losses[-1]:.3f}, {skipped} fp16 "
            "overflow skips) and resumes bitwise")


def main(out: Path) -> None:
    assert torch.cuda.is_available(), "this script checks the GPU path: run it on a machine with a CUDA GPU"
    for stage, precision in ((2, "fp16"), (3, "bf16"), (1, "no")):
        print(f"ok: {check_stage(stage, precision, out)}", flush=True)
    print("GPU DEEPSPEED CHECKS PASSED", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
