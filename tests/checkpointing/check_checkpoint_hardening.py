"""Run with `hasten launch -n 2 check_checkpoint_hardening.py WORKDIR`: on 2 processes, a damaged newest
checkpoint is skipped by load_state() (every process falls back to the same previous one, also when only one
process found the damage), and an explicitly named damaged folder raises on every process, changing nothing.

Then each process saves into a folder of its own (as scripts under Ray Train do): a file name found in two folders
holds the same bytes in both (process 1's marker is its own), the folders copied into one form a checkpoint that
restores every process, each folder alone loads on its own process, rank 0's folder alone loads everywhere with
process 1 told that its random states are lost, a damaged file of the merged folder is refused, and a shared-folder
checkpoint missing a process's random states is still refused."""
import json
import logging
import os
import shutil
import sys

import torch
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import CheckpointError
from hasten.state import AcceleratorState, GradientState, PartialState


def build(workdir, automatic=True):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    config = ProjectConfiguration(project_dir=workdir, automatic_checkpoint_naming=automatic)
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

    # the main process cannot even look at the named folder: it raises its error, the other process names it
    from hasten.checkpointing import loading
    original = loading.recover_interrupted_swap
    if state.is_main_process:
        loading.recover_interrupted_swap = lambda *args: (_ for _ in ()).throw(PermissionError("no access here"))
    try:
        accelerator.load_state(first)
        raise AssertionError("a folder the main process cannot look at loaded")
    except (PermissionError, CheckpointError) as error:
        assert "no access here" in str(error) and (state.is_main_process or "process 0" in str(error)), error
    loading.recover_interrupted_swap = original

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
    process_folders(workdir)


class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def refused(accelerator, folder, model, words):
    set_weights(model, 9.0)
    try:
        accelerator.load_state(folder)
    except CheckpointError as error:
        assert words in str(error), error
        assert torch.all(weights(model) == 9.0), "a refused load changed the weights"
        return
    raise AssertionError(f"{folder} loaded")


def process_folders(workdir):
    os.environ.pop("HASTEN_CHECKPOINT_CHECKSUMS", None)
    state = PartialState()
    rank, count = state.process_index, state.num_processes
    accelerator, model, optimizer = build(workdir, automatic=False)
    set_weights(model, 3.0)
    own = os.path.join(workdir, f"own_{rank}")
    accelerator.save_state(own)
    after_save = torch.rand(3)  # each process's random stream right after the save
    state.wait_for_everyone()
    folders = [os.path.join(workdir, f"own_{i}") for i in range(count)]
    names = [set(os.listdir(folder)) for folder in folders]
    for name in names[0] & names[1]:  # a name in two folders holds the same bytes in both
        first, second = (open(os.path.join(folder, name), "rb").read() for folder in folders)
        assert first == second, name
    assert "hasten_checkpoint.json" in names[0] and "hasten_checkpoint.json" not in names[1], names
    own_marker = json.load(open(os.path.join(folders[1], "hasten_checkpoint.process_1.json")))
    assert "random_states_1.pkl" in own_marker["files"] and "random_states_0.pkl" not in own_marker["files"]
    merged = os.path.join(workdir, "merged")
    if state.is_main_process:  # what an engine does with every rank's reported folder
        for i in range(count):
            shutil.copytree(os.path.join(workdir, f"own_{i}"), merged, dirs_exist_ok=True)
    state.wait_for_everyone()

    for folder in (merged, own):  # the merged folder, and each process's own folder alone
        set_weights(model, 9.0)
        accelerator.load_state(folder)
        assert torch.all(weights(model) == 3.0), folder
        assert torch.equal(torch.rand(3), after_save), f"{folder}: random states not restored on process {rank}"

    said = Said()
    logging.getLogger("hasten").addHandler(said)
    set_weights(model, 9.0)
    accelerator.load_state(os.path.join(workdir, "own_0"))  # only rank 0's folder was kept
    logging.getLogger("hasten").removeHandler(said)
    assert torch.all(weights(model) == 3.0)
    lost = [message for message in said.messages if "holds no random states of process" in message]
    assert len(lost) == (1 if rank else 0), said.messages

    if state.is_main_process:
        path = os.path.join(merged, "model.safetensors")
        data = bytearray(open(path, "rb").read())
        data[-1] ^= 0xFF
        open(path, "wb").write(bytes(data))
    state.wait_for_everyone()
    refused(accelerator, merged, model, "model.safetensors")

    shared = os.path.join(workdir, "shared")
    set_weights(model, 3.0)
    accelerator.save_state(shared)
    state.wait_for_everyone()  # process 1 has added its files
    if state.is_main_process:
        os.remove(os.path.join(shared, "random_states_1.pkl"))
    state.wait_for_everyone()
    refused(accelerator, shared, model, "random_states_1.pkl")
    print(f"PROCESS FOLDERS OK {rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
