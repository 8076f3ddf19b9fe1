"""FSDP2 asynchronous sharded save killed mid-write (run by tests/strategies/fsdp/test_fsdp.py, ``hasten launch -n 2``).

``save`` phase: save checkpoint_0 (complete) and its full weights (``expected.pt``), train a step, then start
``save_state(async_save=True)`` with the shard writer slowed down: once it has begun writing, ``writing`` appears in
the work folder and the test kills the job. ``load`` phase: a new job's ``load_state()`` (automatic naming: the
newest complete checkpoint) loads checkpoint_0, whose weights must equal ``expected.pt``. Prints KILL CHECK PASSED.
"""
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from hasten import Accelerator, FullyShardedDataParallelPlugin, ProjectConfiguration
from hasten.utils import set_seed


def setup(work: Path):
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
                              project_config=ProjectConfiguration(project_dir=str(work),
                                                                  automatic_checkpoint_naming=True))
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def step(accelerator, model, optimizer) -> None:
    accelerator.backward(model(torch.randn(4, 8)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def save_phase(work: Path) -> None:
    accelerator, model, optimizer = setup(work)
    step(accelerator, model, optimizer)
    accelerator.save_state()  # checkpoint_0, complete
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save(weights, work / "expected.pt")
    step(accelerator, model, optimizer)
    original = dcp.save

    def slow_save(*args, **kwargs):
        (work / "writing").write_text("now")
        time.sleep(600)  # killed here, in the background writer, before any shard is complete
        return original(*args, **kwargs)

    dcp.save = slow_save
    accelerator.save_state(async_save=True)  # checkpoint_1: returns at once, its files are written in the background
    while True:
        time.sleep(0.2)
        step(accelerator, model, optimizer)  # training goes on until the job is killed


def load_phase(work: Path) -> None:
    accelerator, model, optimizer = setup(work)
    folder = accelerator.load_state()
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        expected = torch.load(work / "expected.pt", weights_only=True)
        assert folder.endswith("checkpoint_0"), folder
        assert all(torch.equal(weights[k], expected[k]) for k in expected), "checkpoint_0's weights"
        print("KILL CHECK PASSED", flush=True)


if __name__ == "__main__":
    (save_phase if sys.argv[1] == "save" else load_phase)(Path(sys.argv[2]))
