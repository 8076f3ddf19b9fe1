"""Started as `python check_engine_variables.py` once per process, with exactly the variables an engine sets (no
launcher): the processes form one job and train as one (the same averaged weights on every process), and process 0
saves and reloads a checkpoint. Prints "ENGINE OK <engine> <rank>/<world>"."""
import os
import sys

import torch
from torch import nn

from hasten import Accelerator
from hasten.core.cluster import place_process


def main():
    engine = place_process().engine
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2 and accelerator.distributed_type.value == "MULTI_CPU", (world, accelerator.distributed_type)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.full((8, 4), float(rank + 1))  # each process its own batch: DDP averages the gradients
    for _ in range(2):
        loss = model(data).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = accelerator.gather(weights[None])
    assert torch.equal(gathered[0], gathered[1]), "the processes trained apart"
    folder = os.path.join(sys.argv[1], "checkpoint")
    accelerator.save_state(folder)
    accelerator.load_state(folder)
    accelerator.wait_for_everyone()
    print(f"ENGINE OK {engine} {rank}/{world}", flush=True)


if __name__ == "__main__":
    main()
