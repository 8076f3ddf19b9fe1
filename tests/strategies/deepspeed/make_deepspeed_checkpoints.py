"""Write real DeepSpeed engine checkpoints, one per ZeRO stage / precision, with the true full values beside them.

Run with ``hasten launch -n 2 tests/strategies/deepspeed/make_deepspeed_checkpoints.py OUT``. DeepSpeed is driven by hand
on CPU (gloo), without hasten's Accelerator, so that tests/strategies/deepspeed/test_deepspeed_reader.py can check that
``hasten.checkpointing.deepspeed_reader`` rebuilds from the files alone exactly what the live engine held.

For each case it trains three steps, then writes ``OUT/<case>/pytorch_model/`` (the engine's checkpoint) and,
from rank 0, ``OUT/<case>/expected.pt``: the full fp32 parameters and Adam moments by name, as the engine reports
them (collectively, before saving), plus the parameter names per optimizer group and the ``param_groups`` that
``torch.optim.AdamW.state_dict()`` of the same model would have.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from torch import nn  # noqa: E402

# name -> (zero stage, bf16, extra config). Stage 1 bf16 with fp32 gradient accumulation is what makes DeepSpeed
# pick its BF16_Optimizer; bf16 at stage 0 goes through its FP16_UnfusedOptimizer in bf16 mode (the fused one
# needs FusedAdam, a GPU op).
CASES = {
    "stage0_fp32": (0, False, {}),
    "stage1_fp32": (1, False, {}),
    "stage2_fp32": (2, False, {}),
    "stage3_fp32": (3, False, {}),
    "stage0_bf16": (0, True, {}),
    "stage1_bf16_optimizer": (1, True, {"data_types": {"grad_accum_dtype": "fp32"}}),
    "stage2_bf16": (2, True, {}),
    "stage3_bf16": (3, True, {}),
}
STEPS = 3


class TiedNet(nn.Module):
    """A small model with a buffer and one parameter shared by two modules (saved under both names)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.act = nn.Tanh()
        self.mid = nn.Linear(32, 32, bias=False)
        self.mid_again = nn.Linear(32, 32, bias=False)
        self.mid_again.weight = self.mid.weight
        self.out = nn.Linear(32, 2)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))  # exact in bf16

    def forward(self, x):
        h = self.act(self.inp(x))
        h = self.act(self.mid(h)) + self.act(self.mid_again(h))
        return self.out(h) * self.scale


def param_groups(model):
    """Two groups with different hyperparameters: the input layer, then everything else (module order)."""
    first = [model.inp.weight, model.inp.bias]
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    return [{"params": first, "lr": 1e-2, "weight_decay": 0.1},
            {"params": rest, "lr": 5e-3, "weight_decay": 0.0, "betas": (0.8, 0.95)}]


def make_optimizer(model):
    return torch.optim.AdamW(param_groups(model), lr=1e-3, eps=1e-6)


def names_per_group(model):
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in param_groups(model)]


def torch_param_groups(model):
    """The param_groups that plain PyTorch's AdamW.state_dict() has for this model."""
    return make_optimizer(model).state_dict()["param_groups"]


def fp16_optimizer_truth(engine, name_of):
    """Full values from a live FP16_UnfusedOptimizer (bf16 at stage 0): one fp32 master copy per parameter."""
    wrapper = engine.optimizer
    weights, moments = {}, {"exp_avg": {}, "exp_avg_sq": {}}
    for low_group, master_group in zip(wrapper.fp16_groups, wrapper.fp32_groups):
        for low, master in zip(low_group, master_group):
            weights[name_of[low]] = master.detach().clone()
            for key in moments:
                moments[key][name_of[low]] = wrapper.optimizer.state[master][key].clone()
    return weights, moments


def truth(engine, stage, bf16):
    """The full fp32 parameters and moments by name, from the live engine (collective for ZeRO)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    name_of = {p: n for n, p in engine.module.named_parameters()}
    if stage == 0 and bf16:
        return fp16_optimizer_truth(engine, name_of)
    relink = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if relink is not None:
        # DeepSpeed links each parameter to its optimizer-state slices once, right after the first group's first
        # step, when later groups have no state yet; with several param groups those stay unlinked. Link again.
        engine.optimizer._hp_optimizer_states_linked = False
        relink()
    weights, moments = {}, {"exp_avg": {}, "exp_avg_sq": {}}
    for p, name in name_of.items():
        if stage == 0:
            weights[name] = p.detach().clone()
            for key in moments:
                moments[key][name] = engine.optimizer.state[p][key].clone()
        else:
            weights[name] = safe_get_full_fp32_param(p).detach().cpu().clone()
            for key in moments:
                moments[key][name] = safe_get_full_optimizer_state(p, key).detach().cpu().clone()
    return weights, moments


def run_case(name, stage, bf16, extra, out: Path):
    import deepspeed
    import torch.distributed as dist

    torch.manual_seed(0)
    model = TiedNet()
    expected_keys = list(model.state_dict())
    groups_names, groups_torch = names_per_group(model), torch_param_groups(model)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}, **extra}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(model), config=config)
    dtype = torch.bfloat16 if bf16 else torch.float32
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(STEPS):
        x = torch.randn(4, 8, generator=generator).to(dtype)
        y = torch.randn(4, 2, generator=generator)
        loss = nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
    weights, moments = truth(engine, stage, bf16)
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)  # the torch AdamW under DeepSpeed's wrapper
    steps = {float(s["step"]) for s in base.state.values()}
    assert len(steps) == 1, steps  # DeepSpeed's FP16_UnfusedOptimizer takes one warm-up step with zero gradients
    buffers = {k: v.detach().float().clone() for k, v in engine.module.named_buffers()}
    engine.save_checkpoint(str(out / name), tag="pytorch_model")
    if dist.get_rank() == 0:
        torch.save({"stage": stage, "bf16": bf16, "world_size": dist.get_world_size(), "step": steps.pop(),
                    "state_dict_keys": expected_keys, "weights": weights, "buffers": buffers, **moments,
                    "names": groups_names, "param_groups": groups_torch,
                    "optimizer_class": type(engine.optimizer).__name__},
                   out / name / "expected.pt")
    dist.barrier()
    engine.destroy()


def main():
    out = Path(sys.argv[1])
    only = sys.argv[2:] or list(CASES)
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    for name in only:
        started = time.perf_counter()
        run_case(name, *CASES[name], out)
        if dist.get_rank() == 0:
            print(f"made {name} in {time.perf_counter() - started:.1f}s", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:
        print("DEEPSPEED CHECKPOINTS MADE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
