"""Run twice with `hasten launch -n 2`: `... train WORKDIR`, then `... resume WORKDIR` (a new process run).

Exact resume: a DDP run with shuffling, dropout, AdamW and a scheduler, stopped in the middle of its second
epoch and resumed in a new process, must end with parameters bitwise equal to the uninterrupted run's. Three
ways of resuming the data are checked:

- "skip": the reference library's documented pattern: load_state, then skip_first_batches(loader, steps done
  in the epoch) for the interrupted epoch, the plain loader afterwards;
- "stateful": use_stateful_dataloader=True (torchdata), load_state alone restores the loader's position;
- "state": the default loader, load_state alone (the prepared loader's own state).

`train` runs each variant uninterrupted twice, once without saving and once saving a checkpoint at the stop
point (saving must not change the run), and writes the final parameters; `resume` starts from the
checkpoints and compares. Both also check the position the prepared loader reports one batch after the stop
point (what a save there would record), in the resumed run also while skip_first_batches' copy is iterating.
"""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, ProjectConfiguration
from hasten.config.data import DataLoaderConfiguration
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.utils import set_seed

SAMPLES, BATCH, EPOCHS = 40, 4, 3  # 5 batches per process and epoch on 2 processes
STOP_EPOCH, STOP_STEP = 1, 2  # save after the 2nd batch of the 2nd epoch
VARIANTS = ("skip", "stateful", "state")


class Progress:
    """Where the loop is: registered for checkpointing so the resumed script knows where to continue."""

    def __init__(self):
        self.epoch, self.step_in_epoch = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state):
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]


def build(variant, workdir):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(1234)
    project = ProjectConfiguration(project_dir=os.path.join(workdir, variant),
                                   automatic_checkpoint_naming=variant != "skip",
                                   save_on_each_node=variant == "state")  # one machine: the same files
    accelerator = Accelerator(project_config=project, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=variant == "stateful"))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    g = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(SAMPLES, 6, generator=g), torch.randn(SAMPLES, 1, generator=g))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    return accelerator, model, optimizer, loader, scheduler, progress


def checkpoint_dir(variant, workdir):
    return os.path.join(workdir, "skip_checkpoint") if variant == "skip" else None


def train(variant, workdir, save=False, resume=False):
    accelerator, model, optimizer, loader, scheduler, progress = build(variant, workdir)
    if resume:
        accelerator.load_state(checkpoint_dir(variant, workdir))
        assert (progress.epoch, progress.step_in_epoch) == (STOP_EPOCH, STOP_STEP), progress.state_dict()
    start_epoch, resume_step = progress.epoch, progress.step_in_epoch
    for epoch in range(start_epoch, EPOCHS):
        progress.epoch = epoch
        active = loader
        if variant == "skip" and resume and epoch == start_epoch and resume_step:
            active = accelerator.skip_first_batches(loader, resume_step)
        progress.step_in_epoch = resume_step if resume and epoch == start_epoch else 0
        for x, y in active:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step_in_epoch += 1
            if save and (epoch, progress.step_in_epoch) == (STOP_EPOCH, STOP_STEP):
                accelerator.save_state(checkpoint_dir(variant, workdir))
            if (epoch, progress.step_in_epoch) == (STOP_EPOCH, STOP_STEP + 1):
                # what a save_state here would record for the prepared loader (also while a skipping copy runs)
                position = loader.resume_state_dict()
                positions = (position["epoch"], position["batches_yielded"])
        assert progress.step_in_epoch == SAMPLES // BATCH // accelerator.num_processes, progress.step_in_epoch
    assert positions == (STOP_EPOCH, STOP_STEP + 1), f"{variant}: the loader reports position {positions}"
    return {name: value.detach().clone() for name, value in accelerator.unwrap_model(model).state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main():
    phase, workdir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    for variant in VARIANTS:
        reference_file = os.path.join(workdir, f"{variant}_uninterrupted_rank{rank}.pt")
        if phase == "train":
            plain = train(variant, workdir)
            saved = train(variant, workdir, save=True)
            assert same(plain, saved), f"{variant}: saving a checkpoint changed the run"
            torch.save(plain, reference_file)
        else:
            expected = torch.load(reference_file)
            resumed = train(variant, workdir, resume=True)
            differing = [k for k in expected if not torch.equal(expected[k], resumed[k])]
            assert not differing, f"{variant}: the resumed run differs from the uninterrupted one in {differing}"
        print(f"rank {rank}: {variant} {phase} OK", flush=True)
    AcceleratorState._reset_state()
    if rank == 0:
        print(f"check_checkpoint_resume {phase} OK", flush=True)
    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()  # leaving it to interpreter exit can abort the process (gloo)


if __name__ == "__main__":
    main()
