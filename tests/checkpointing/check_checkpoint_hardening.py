"""Run with `hasten launch -n 2 check_checkpoint_hardening.py WORKDIR`: on 2 processes, a damaged newest
checkpoint is skipped by load_state() (every process falls back to the same previous one, also when only one
process found the damage), and an explicitly named damaged folder raises on every process, changing nothing."""
import os
import shutil
import sys

import torch
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import CheckpointError
from hasten.state import AcceleratorState, GradientState, PartialState


def build(workdir):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    config = ProjectConfiguration(project_dir=workdir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def set_weights(model, value):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)


def weights(model):
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def main(workdir):
    state = PartialState()
    checkpoints = os.path.join(workdir, "checkpoints")
    accelerator, model, optimizer = build(workdir)
    set_weights(model, 1.0)
    first = accelerator.save_state()
    set_weights(model, 2.0)
    second = accelerator.save_state()
    if state.is_main_process:  # the shared optimizer file of the newest checkpoint is damaged
        path = os.path.join(second, "optimizer.bin")
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(path, "wb").write(bytes(data))
    state.wait_for_everyone()

    accelerator, model, optimizer = build(workdir)
    set_weights(model, 5.0)
    assert accelerator.load_state() == first, "did not fall back to the previous checkpoint"
    assert torch.all(weights(model) == 1.0)
    set_weights(model, 5.0)
    try:
        accelerator.load_state(second)
        raise AssertionError("an explicitly named damaged checkpoint loaded")
    except CheckpointError as error:
        assert "optimizer.bin" in str(error), error
    assert torch.all(weights(model) == 5.0), "a refused load changed the weights"

    # only process 1 can see the damage: its own random states (checksums off, so only it parses the file)
    os.environ["HASTEN_CHECKPOINT_CHECKSUMS"] = "0"
    if state.is_main_process:
        shutil.rmtree(second)
    state.wait_for_everyone()
    third = accelerator.save_state()
    if state.process_index == 1:
        path = os.path.join(third, "random_states_1.pkl")
        size = os.path.getsize(path)
        with open(path, "wb") as handle:
            handle.write(b"\0" * size)
    state.wait_for_everyone()
    accelerator, model, optimizer = build(workdir)
    set_weights(model, 7.0)
    assert accelerator.load_state() == first, "the processes did not agree to fall back"
    assert torch.all(weights(model) == 1.0)
    print(f"HARDENING OK {state.process_index} {sorted(os.listdir(checkpoints))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
