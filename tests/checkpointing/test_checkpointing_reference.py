"""Cross-library checkpoints, single device: hasten loads what the reference library (Accelerate) saved and the
other way round; needs the `reference` extra."""
import random

import numpy as np
import pytest
import torch
from torch import nn

import hasten
from hasten.state import AcceleratorState, GradientState
from fixtures import Counter

accelerate = pytest.importorskip("accelerate")


def build(library, seed):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()
    torch.manual_seed(seed)
    accelerator = library.Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return (accelerator, *accelerator.prepare(model, optimizer, scheduler), counter)


@pytest.mark.parametrize("saver,loader", [("hasten", "accelerate"), ("accelerate", "hasten")])
def test_a_checkpoint_of_one_library_loads_in_the_other(tmp_path, saver, loader):
    libraries = {"hasten": hasten, "accelerate": accelerate}
    accelerator, model, optimizer, scheduler, counter = build(libraries[saver], seed=0)
    for _ in range(3):
        accelerator.backward(model(torch.randn(4, 3)).square().mean())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    counter.value = 9
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    accelerator.save_state(str(tmp_path / "ckpt"))
    expected = ([p.detach().clone() for p in model.parameters()], optimizer.state_dict(), scheduler.state_dict(),
                random.random(), np.random.rand(), torch.rand(2))

    accelerator, model, optimizer, scheduler, counter = build(libraries[loader], seed=5)
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected[0]))
    for index, state in expected[1]["state"].items():
        assert all(torch.equal(optimizer.state_dict()["state"][index][k], v) for k, v in state.items())
    assert scheduler.state_dict() == expected[2]
    assert counter.value == 9
    assert (random.random(), np.random.rand()) == expected[3:5] and torch.equal(torch.rand(2), expected[5])


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(4, 3)
        self.head = nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight


def tied_model(library, seed):
    AcceleratorState._reset_state(True)
    accelerate.state.AcceleratorState._reset_state(True)
    torch.manual_seed(seed)
    accelerator = library.Accelerator(cpu=True)
    return accelerator, accelerator.prepare(Tied())


@pytest.mark.parametrize("saver,loader", [("hasten", "accelerate"), ("accelerate", "hasten")])
def test_tied_weights_cross_over_both_ways(tmp_path, saver, loader):
    libraries = {"hasten": hasten, "accelerate": accelerate}
    accelerator, saved = tied_model(libraries[saver], seed=0)
    accelerator.save_state(str(tmp_path / "ckpt"))
    accelerator, model = tied_model(libraries[loader], seed=1)
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert torch.equal(model.embed.weight, saved.embed.weight) and model.head.weight is model.embed.weight
