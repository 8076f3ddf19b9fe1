"""Accelerate's documented resume loop, unchanged, on `hasten launch -n 2`: three launches.

    ... reference WORKDIR   an uninterrupted run; writes the final parameters
    ... stop WORKDIR        the same run, saving `step_{n}` every CHECKPOINT_EVERY steps; it dies mid-epoch, a
                            step after its last checkpoint (that step's work is lost)
    ... resume WORKDIR      a new process run: load the newest checkpoint, then exactly the loop of Accelerate's
                            examples (complete_nlp_example.py):

        accelerator.load_state(checkpoint)
        starting_epoch, resume_step = divmod(completed_steps, len(train_dataloader))
        for epoch in range(starting_epoch, EPOCHS):
            if epoch == starting_epoch and resume_step:
                active = accelerator.skip_first_batches(train_dataloader, resume_step)
            else:
                active = train_dataloader
            ...

The resumed run must end with parameters bitwise equal to the uninterrupted run's, with shuffling, dropout,
AdamW and a scheduler, evaluation after every epoch, for the default loader, a seedable sampler,
dispatched batches and torchdata's StatefulDataLoader. It relies on len(train_dataloader) being the epoch length after load_state.
"""
import importlib.util
import os
import re
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.data import DataLoaderConfiguration
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.utils import set_seed

SAMPLES, BATCH, EPOCHS = 40, 4, 3  # 5 batches per process and epoch on 2 processes
CHECKPOINT_EVERY, DIES_AFTER = 3, 7  # checkpoints step_3, step_6; the run dies after step 7
VARIANTS = {
    "default": {},
    "seedable": {"use_seedable_sampler": True, "data_seed": 11},
    "dispatch": {"dispatch_batches": True},
}
if importlib.util.find_spec("torchdata") is not None:  # the `stateful` extra
    VARIANTS["stateful"] = {"use_stateful_dataloader": True}


def build(variant):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(1234)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**VARIANTS[variant]))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    g = torch.Generator().manual_seed(7)
    train = TensorDataset(torch.randn(SAMPLES, 6, generator=g), torch.randn(SAMPLES, 1, generator=g))
    evaluation = TensorDataset(torch.randn(10, 6, generator=g), torch.randn(10, 1, generator=g))
    train_dataloader = DataLoader(train, batch_size=BATCH, shuffle=True)
    eval_dataloader = DataLoader(evaluation, batch_size=3)
    return (accelerator, *accelerator.prepare(model, optimizer, train_dataloader, eval_dataloader, scheduler))


def newest_checkpoint(folder):
    steps = [int(m.group(1)) for name in os.listdir(folder) if (m := re.fullmatch(r"step_(\d+)", name))]
    return os.path.join(folder, f"step_{max(steps)}") if steps else None


def run(variant, phase, workdir):
    accelerator, model, optimizer, train_dataloader, eval_dataloader, scheduler = build(variant)
    folder = os.path.join(workdir, variant)
    starting_epoch, resume_step, completed_steps = 0, 0, 0
    if phase == "resume":
        checkpoint = newest_checkpoint(folder)
        accelerator.load_state(checkpoint)
        completed_steps = int(os.path.basename(checkpoint)[len("step_"):])
        assert completed_steps == DIES_AFTER // CHECKPOINT_EVERY * CHECKPOINT_EVERY, checkpoint
        starting_epoch, resume_step = divmod(completed_steps, len(train_dataloader))
    steps_per_epoch = SAMPLES // BATCH // accelerator.num_processes
    assert len(train_dataloader) == steps_per_epoch, (variant, len(train_dataloader))
    for epoch in range(starting_epoch, EPOCHS):
        model.train()
        if epoch == starting_epoch and resume_step:
            active = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active = train_dataloader
        for x, y in active:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1
            if phase == "stop" and completed_steps % CHECKPOINT_EVERY == 0:
                accelerator.save_state(os.path.join(folder, f"step_{completed_steps}"))
            if phase == "stop" and completed_steps == DIES_AFTER:
                return None  # the job dies here: the step after the last checkpoint is lost
        model.eval()
        errors = []
        with torch.no_grad():
            for x, y in eval_dataloader:
                errors.append(accelerator.gather_for_metrics((model(x) - y).abs()))
        assert torch.cat(errors).numel() == 10
        assert len(train_dataloader) == steps_per_epoch
    assert completed_steps == EPOCHS * steps_per_epoch, completed_steps
    return {name: value.detach().clone() for name, value in accelerator.unwrap_model(model).state_dict().items()}


def main():
    phase, workdir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    for variant in VARIANTS:
        reference_file = os.path.join(workdir, f"{variant}_reference_rank{rank}.pt")
        params = run(variant, phase, workdir)
        if phase == "reference":
            torch.save(params, reference_file)
        elif phase == "resume":
            expected = torch.load(reference_file)
            differing = [k for k in expected if not torch.equal(expected[k], params[k])]
            assert not differing, f"{variant}: the resumed run differs from the uninterrupted one in {differing}"
        print(f"rank {rank}: {variant} {phase} OK", flush=True)
    AcceleratorState._reset_state()
    if rank == 0:
        print(f"check_documented_resume {phase} OK", flush=True)
    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()  # leaving it to interpreter exit can abort the process (gloo)


if __name__ == "__main__":
    main()
