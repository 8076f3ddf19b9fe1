"""Started as `python check_engine_variables.py` once per process, with exactly the variables an engine sets (no
launcher): the processes form one job and train as one (the weights single-process PyTorch reaches on both
processes' batches together), and save and reload a checkpoint. With `HASTEN_CONFIG_FILE` naming an FSDP
config file (as a pod's command would), the file's backend section, precision and accumulation steps apply as under
`hasten launch --config_file`. Prints "ENGINE OK <engine> <distributed type> <rank>/<world>"."""
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
    kind = accelerator.distributed_type.value
    if os.environ.get("HASTEN_CONFIG_FILE"):  # the file says: FSDP2, accumulation 2
        assert kind == "FSDP" and accelerator.state.fsdp_plugin.fsdp_version == 2, kind
        assert accelerator.gradient_accumulation_steps == 2, accelerator.gradient_accumulation_steps
    else:
        assert kind == "MULTI_CPU", kind
    assert world == 2, world
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    reference = nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.full((8, 4), float(rank + 1))  # each process its own batch: the gradients are averaged
    for _ in range(2):
        loss = model(data).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    both = torch.cat([torch.full((8, 4), 1.0), torch.full((8, 4), 2.0)])
    for _ in range(2):
        (reference(both).pow(2).mean() / accelerator.gradient_accumulation_steps).backward()  # as backward() does
        plain.step()
        plain.zero_grad()
    state = accelerator.get_state_dict(model)  # whole tensors (on the main process only when FSDP shards them)
    assert state or (kind == "FSDP" and rank != 0), "no weights on the main process"
    for name, tensor in reference.state_dict().items():
        if state:
            torch.testing.assert_close(state[name], tensor, rtol=1e-5, atol=1e-6, msg=f"{name} on process {rank}")
    folder = os.path.join(sys.argv[1], "checkpoint")
    accelerator.save_state(folder)
    accelerator.load_state(folder)
    accelerator.wait_for_everyone()
    print(f"ENGINE OK {engine} {kind} {rank}/{world}", flush=True)


if __name__ == "__main__":
    main()
