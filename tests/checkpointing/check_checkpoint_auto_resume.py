"""Run with `hasten launch -n 2 --max_restarts 1 check_checkpoint_auto_resume.py WORKDIR`.

First attempt: training with automatic checkpoint naming (a checkpoint every 4 steps, total_limit=2); during
the save at step 12, process 1 kills itself (os._exit) once it has begun adding its own files to the checkpoint that
process 0 writes (process 0 waits for that before writing), so the job dies in the middle of a save. The launcher restarts both processes. Second attempt: `auto_resume`
must load the newest *complete* checkpoint (step 8, in the middle of the second epoch, not the half-written
one), the run finishes, and its
parameters must be bitwise equal to those of an uninterrupted run (computed at the end, in the same job).
"""
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import auto_resume
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.utils import set_seed

SAMPLES, BATCH, EPOCHS, SAVE_EVERY, KILL_AT = 48, 4, 2, 4, 12  # 6 steps per epoch and process


class Step:
    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def die(models, weights, staging):
    """Save hook of process 1: it has begun adding its files to this save (contributions.py), and dies."""
    print(f"process 1 dies while {os.path.basename(staging)} is being written", flush=True)
    os._exit(17)


def wait_for_process_1(models, weights, staging):
    """Save hook of process 0: write this save's files only once process 1 has begun adding its own."""
    own = os.path.join(os.path.dirname(staging), os.path.basename(staging).replace(".incomplete", ".process_1.incomplete"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not os.path.isdir(own):
        time.sleep(0.01)


def run(project_dir, crash):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(99)
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=2))
    model = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.Dropout(0.25), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(SAMPLES, 5, generator=g), torch.randn(SAMPLES, 1, generator=g))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, DataLoader(data, BATCH, shuffle=True),
                                                              scheduler)
    step = Step()
    accelerator.register_for_checkpointing(step)
    resumed = auto_resume(accelerator)  # the one-liner: no-op on a fresh start
    if resumed is not None:
        assert os.path.basename(resumed) == "checkpoint_1", resumed  # saved at step 8; checkpoint_2 never completed
        assert step.value == 2 * SAVE_EVERY, step.value
    steps_per_epoch = SAMPLES // BATCH // accelerator.num_processes
    for _ in range(step.value // steps_per_epoch, EPOCHS):
        for x, y in loader:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step.value += 1
            if step.value % SAVE_EVERY == 0:
                if crash and step.value == KILL_AT:
                    accelerator.register_save_state_pre_hook(die if accelerator.process_index == 1
                                                             else wait_for_process_1)
                accelerator.save_state()
    assert step.value == EPOCHS * steps_per_epoch, step.value
    return {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def main():
    workdir = sys.argv[1]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    project = os.path.join(workdir, "job")
    final = run(project, crash=attempt == 0)
    assert attempt == 1, "the first attempt should have died in the middle of a save"
    PartialState().wait_for_everyone()  # process 1 adds its files to the last save after process 0's returned
    checkpoints = sorted(os.listdir(os.path.join(project, "checkpoints")))
    assert checkpoints == ["checkpoint_1", "checkpoint_2"], checkpoints  # total_limit=2, no staging left behind
    expected = run(os.path.join(workdir, "uninterrupted"), crash=False)
    differing = [k for k in expected if not torch.equal(expected[k], final[k])]
    assert not differing, f"the restarted job differs from the uninterrupted one in {differing}"
    AcceleratorState._reset_state()
    if int(os.environ["RANK"]) == 0:
        print(f"check_checkpoint_auto_resume OK after {attempt} restart", flush=True)
    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()  # leaving it to interpreter exit can abort the process (gloo)


if __name__ == "__main__":
    main()
