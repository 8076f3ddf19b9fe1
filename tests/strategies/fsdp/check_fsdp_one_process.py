"""FSDP on one process, as people debug it on one device: ``python check_fsdp_one_process.py HOW OUT_DIR``.

HOW is ``plugin1`` (``FullyShardedDataParallelPlugin(fsdp_version=1)``) or ``env2`` (FSDP2 chosen by the launcher's
variables, ``HASTEN_USE_FSDP`` / ``FSDP_VERSION``, which the caller sets). Trains a small MLP for 4 steps and checks
the weights equal plain PyTorch's; saves, trains 2 steps, loads and trains the same 2 steps again (bitwise equal);
and round-trips a stateless optimizer (SGD without momentum). Prints ``FSDP ONE PROCESS PASSED HOW``.
"""
import sys
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator, FullyShardedDataParallelPlugin
from hasten.utils import DistributedType

TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(count):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)) for _ in range(count)]


def step(model, optimizer, batch, backward=None):
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    (backward or torch.Tensor.backward)(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def main(how: str, out: Path) -> None:
    data = batches(6)
    plain = build()
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    expected = [step(plain, plain_optimizer, batch) for batch in data[:4]]

    plugin = FullyShardedDataParallelPlugin(fsdp_version=1) if how == "plugin1" else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    assert accelerator.distributed_type == DistributedType.FSDP, accelerator.distributed_type
    assert accelerator.num_processes == 1 and accelerator.is_fsdp2 == (how == "env2")
    model = build()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = [step(model, optimizer, batch, accelerator.backward) for batch in data[:4]]
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, expected)), (losses, expected)
    weights = accelerator.get_state_dict(model)
    for name, value in plain.state_dict().items():
        assert torch.allclose(weights[name], value, **TOLERANCE), name

    accelerator.save_state(out / "checkpoint")
    after = [step(model, optimizer, batch, accelerator.backward) for batch in data[4:]]
    accelerator.load_state(out / "checkpoint")
    again = [step(model, optimizer, batch, accelerator.backward) for batch in data[4:]]
    assert after == again, (after, again)

    # a stateless optimizer: its checkpoint has no tensors, torch's loader needs some
    simple = build()
    simple, sgd = accelerator.prepare(simple, torch.optim.SGD(simple.parameters(), lr=0.1))
    step(simple, sgd, data[0], accelerator.backward)
    accelerator.save_state(out / "sgd")
    sgd.param_groups[0]["lr"] = 0.5
    accelerator.load_state(out / "sgd")
    assert sgd.param_groups[0]["lr"] == 0.1
    print("FSDP ONE PROCESS PASSED", how, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
