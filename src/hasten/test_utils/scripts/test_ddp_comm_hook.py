"""DDP communication hooks end to end (Accelerate's multi-device suite launches this file,
``test_utils/scripts/test_ddp_comm_hook.py``): every hook and wrapper ``DistributedDataParallelKwargs`` offers, on
two or more processes.

For each combination the model ``Accelerator.prepare`` wraps (with the hook registered) and a plain
``torch.nn.parallel.DistributedDataParallel`` without a hook compute the gradient of the same loss, which differs
per rank so that the all-reduce matters; the two gradients must agree within the hooks' compression error
(1e-2). The bf16 hook needs NCCL (CUDA 11+, NCCL 2.10+) or XCCL: on gloo torch refuses it, so those combinations are
reported and left out there. Run: ``hasten launch -n 2 <this file>``.
"""
from __future__ import annotations

import torch

from hasten.accelerator import Accelerator
from hasten.config.kwargs import DDPCommunicationHookType, DistributedDataParallelKwargs
from hasten.state import PartialState

NO, FP16, BF16 = DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16
POWER_SGD, BATCHED_POWER_SGD = DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD

#: (hook, wrapper, PowerSGD state options): the combinations checked.
COMBINATIONS = [
    (NO, NO, {}), (FP16, NO, {}), (BF16, NO, {}),
    (POWER_SGD, NO, {}), (POWER_SGD, FP16, {}), (POWER_SGD, BF16, {}), (POWER_SGD, NO, {"matrix_approximation_rank": 2}),
    (BATCHED_POWER_SGD, NO, {}), (BATCHED_POWER_SGD, FP16, {}), (BATCHED_POWER_SGD, BF16, {}),
]


class RankPower(torch.nn.Module):
    """One 40 x 20 parameter; the output is ``p * x ** (1 + rank)``, so each rank's gradient is its own."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(40, 20, generator=torch.Generator().manual_seed(0)))

    def forward(self, x, rank):
        return self.p * x ** (1 + rank)


def gradient(model, rank: int) -> torch.Tensor:
    """The all-reduced gradient of the mean output on one fixed input (the same on every rank)."""
    x = torch.randn(40, 20, generator=torch.Generator().manual_seed(2024)).to(next(model.parameters()).device)
    model(x, rank).mean().backward()
    return next(model.parameters()).grad


def plain_ddp(device: torch.device) -> torch.nn.Module:
    ids = [device.index] if device.type != "cpu" and device.index is not None else None
    return torch.nn.parallel.DistributedDataParallel(RankPower().to(device), device_ids=ids)


def check(hook, wrapper, options) -> None:
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
        comm_hook=hook, comm_wrapper=wrapper, comm_state_option=options)])
    hooked = accelerator.prepare(RankPower())
    assert isinstance(hooked, torch.nn.parallel.DistributedDataParallel), type(hooked)
    rank = accelerator.process_index
    torch.testing.assert_close(gradient(hooked, rank), gradient(plain_ddp(accelerator.device), rank),
                               rtol=1e-2, atol=1e-2)


def main() -> None:
    state = PartialState()
    if state.num_processes < 2:
        raise SystemExit("test_ddp_comm_hook needs two or more processes: hasten launch -n 2 test_ddp_comm_hook.py")
    bf16_ok = state.backend in ("nccl", "xccl")
    for hook, wrapper, options in COMBINATIONS:
        name = f"DDP comm hook: {hook.value}, comm wrapper: {wrapper.value}, state options: {options}"
        if BF16 in (hook, wrapper) and not bf16_ok:
            state.print(f"Left out ({state.backend} has no bf16 all-reduce): {name}")
            continue
        state.print(f"Test {name}")
        check(hook, wrapper, options)
    state.print("DDP COMM HOOKS PASSED")
    state.destroy_process_group()


if __name__ == "__main__":
    main()
