"""Run with `hasten launch -n 2 check_checkpoint_reference.py WORKDIR` (needs the `reference` extra).

Cross-library checkpoints under DDP: a state saved by hasten's save_state loads with the reference library's
load_state (Accelerate, `Accelerator(cpu=True)` so that it shards across the CPU processes), and the other
way round. Checked after loading: parameters, optimizer state, scheduler, the accumulation step, every
process's random generators (the next random numbers) and a registered object.
"""
import os
import sys

import torch
from torch import nn

import accelerate
import hasten
from hasten.state import PartialState


class Counter:
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def build(library, seed):
    torch.manual_seed(seed)
    accelerator = library.Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, scheduler, counter


def train_and_save(library, folder):
    accelerator, model, optimizer, scheduler, counter = build(library, seed=0)
    torch.manual_seed(10 + accelerator.process_index)  # each process's generators differ
    for _ in range(3):
        accelerator.backward(model(torch.randn(5, 4)).square().mean())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    counter.value = 42
    accelerator.save_state(folder)
    expected = {
        "params": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
        "optimizer": optimizer.state_dict()["state"],
        "scheduler": scheduler.state_dict(),
        "next_random": torch.rand(3),
    }
    return expected


def load_and_compare(library, folder, expected, who):
    accelerator, model, optimizer, scheduler, counter = build(library, seed=1)  # different initial weights
    accelerator.load_state(folder)
    rank = accelerator.process_index
    params = list(accelerator.unwrap_model(model).parameters())
    assert all(torch.equal(a, b) for a, b in zip(params, expected["params"])), f"{who}: parameters differ"
    state = optimizer.state_dict()["state"]
    for index, saved in expected["optimizer"].items():
        for key, value in saved.items():
            assert torch.equal(state[index][key], value), f"{who}: optimizer {key} of parameter {index} differs"
    assert scheduler.state_dict() == expected["scheduler"], f"{who}: scheduler differs"
    assert counter.value == 42, f"{who}: registered object not restored"
    assert torch.equal(torch.rand(3), expected["next_random"]), f"{who}: random state of process {rank} differs"


def main():
    workdir = sys.argv[1]
    state = PartialState()  # hasten brings the process group up; the reference library joins it
    for saver, loader in ((hasten, accelerate), (accelerate, hasten)):
        folder = os.path.join(workdir, f"saved_by_{saver.__name__}")
        expected = train_and_save(saver, folder)
        state.wait_for_everyone()
        load_and_compare(loader, folder, expected, f"{saver.__name__} -> {loader.__name__}")
        print(f"rank {state.process_index}: {saver.__name__} -> {loader.__name__} OK", flush=True)
    state.wait_for_everyone()
    if state.is_main_process:
        print("check_checkpoint_reference OK", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
