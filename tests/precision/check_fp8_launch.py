"""Launched by tests/commands/test_launch_fp8.py with a config file's ``mixed_precision: fp8`` and ``fp8_config``:
the torchao options reach the Accelerator's recipe, and the model's middle layers train in fp8."""
import torch
from torch import nn

from hasten import Accelerator
from hasten.config.fp8 import FP8BackendType

accelerator = Accelerator()
assert accelerator.mixed_precision == "fp8" and accelerator.fp8_backend == FP8BackendType.AO
model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
middle = model[1]
assert type(middle).__name__ == "Float8Linear", model
assert middle.config.pad_inner_dim is False, middle.config  # fp8_config's pad_inner_dim: false
loss = model(torch.randn(8, 16)).pow(2).mean()
accelerator.backward(loss)
optimizer.step()
print("fp8 launch ok", middle.config.pad_inner_dim, flush=True)
