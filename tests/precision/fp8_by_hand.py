"""fp8 training done with torchao and torch alone, the yardstick hasten's fp8 runs are compared with (by
tests/precision/test_fp8_training.py and the launched check_fp8_processes.py)."""
import torch
from torch import nn


def train_by_hand(model: nn.Module, converted: tuple, steps: int, x, y) -> nn.Module:
    """``model`` with the layers named ``converted`` made torchao's ``Float8Linear`` (with the fp8 all-gather
    weights hasten's default recipe asks for), trained ``steps`` SGD steps (lr 0.1) on ``(x, y)`` with the forward
    under bf16 autocast and an fp32 mean-squared loss; returned trained."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = convert_to_float8_training(
        model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True, pad_inner_dim=True),
        module_filter_fn=lambda module, fqn: fqn in converted)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model
