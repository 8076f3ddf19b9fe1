"""An elastic FSDP2 training job (run by tests/strategies/fsdp/test_fsdp_elastic.py, two `hasten launch --num_machines 1:2`
agents of 2 processes each on this machine).

Every step appends ``step loss world`` to ``<work>/losses.txt`` (main process) and every SAVE_EVERY steps saves a
sharded checkpoint (automatic naming). On a 4-process world, after the save of step KILL_AT, each process writes its agent's pid
to ``<work>/agents/<rank>`` and meets the others at barriers: the test then kills one agent. The survivor's processes fail, its
agent restarts them, the rendezvous admits the one machine left (2 processes), and ``auto_resume`` loads the newest
sharded checkpoint, resharded from 4 processes to 2; training goes on to TOTAL steps.
"""
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator, FullyShardedDataParallelPlugin, ProjectConfiguration
from hasten.checkpointing import auto_resume
from hasten.utils import set_seed

TOTAL, SAVE_EVERY, KILL_AT = 16, 2, 7


class Progress:
    """The step to continue from, saved with the checkpoint."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = int(state["step"])


def build_model():
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def data():
    generator = torch.Generator().manual_seed(11)
    inputs = torch.randn(256, 8, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def batch_rows(step: int) -> torch.Tensor:
    """The global batch of ``step``, the same whatever the number of processes."""
    return torch.arange(step * 16, step * 16 + 16) % 256


def reference_losses() -> list:
    """The same training without interruption, in one process with plain PyTorch."""
    model, optimizer = build_model()
    inputs, targets = data()
    losses = []
    for step in range(TOTAL):
        rows = batch_rows(step)
        loss = nn.functional.mse_loss(model(inputs[rows]), targets[rows])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main(work: Path) -> None:
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
                              project_config=ProjectConfiguration(project_dir=str(work), total_limit=2,
                                                                  automatic_checkpoint_naming=True))
    model, optimizer = accelerator.prepare(*build_model())
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    resumed = auto_resume(accelerator)
    world = accelerator.num_processes
    inputs, targets = data()
    if accelerator.is_main_process:
        print(f"world={world} resumed={resumed} from_step={progress.step}", flush=True)
    while progress.step < TOTAL:
        step = progress.step
        mine = batch_rows(step).chunk(world)[accelerator.process_index]
        loss = nn.functional.mse_loss(model(inputs[mine]), targets[mine])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        mean = accelerator.reduce(loss.detach(), reduction="mean").item()
        progress.step += 1
        if accelerator.is_main_process:
            with open(work / "losses.txt", "a") as log:
                log.write(f"{step} {mean:.6f} {world}\n")
        if progress.step % SAVE_EVERY == 0:
            accelerator.save_state()
        if step == KILL_AT and world == 4:  # tell the test which agent runs this process, then keep meeting
            (work / "agents").mkdir(exist_ok=True)
            (work / "agents" / str(accelerator.process_index)).write_text(str(os.getppid()))
            while True:  # until the test kills one machine: the survivors' next barrier fails, their agent restarts
                time.sleep(0.3)
                accelerator.wait_for_everyone()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"ELASTIC TRAINING FINISHED world={world}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
