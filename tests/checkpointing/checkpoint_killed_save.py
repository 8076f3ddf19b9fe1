"""Helper of tests/checkpointing/test_checkpointing_atomic.py (plain `python`, one process): save a complete checkpoint, then
start a second save whose optimizer file is written only half-way before the process stops and waits to be
killed (SIGKILL by the test), like a job killed in the middle of writing a checkpoint — while the model's file,
written alongside by another writer thread, is already closed. With the argument ``before_marker``: killed once
every data file is written and flushed, before the completion marker."""
import io
import os
import sys
import time

import torch
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import checksums, full_files, transaction


def half_write_then_wait(obj, path, **_):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
    # the other files are written meanwhile, by the other writer threads (parallel_writes.py): wait for the model's
    model_file = os.path.abspath(os.path.join(os.path.dirname(path), "model.safetensors"))
    deadline = time.monotonic() + 20
    while model_file not in checksums._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"HALF WRITTEN {path} model file closed: {model_file in checksums._pending}", flush=True)
    time.sleep(600)


def wait_before_marker(folder, metadata, *_, **__):
    print(f"DATA WRITTEN {sorted(os.listdir(folder))}", flush=True)
    time.sleep(600)


def main():
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=sys.argv[1], automatic_checkpoint_naming=True, total_limit=1))
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with torch.no_grad():
        model.weight.fill_(1.0)
    accelerator.save_state()  # checkpoint_0, complete
    with torch.no_grad():
        model.weight.fill_(2.0)
    if sys.argv[2:] == ["before_marker"]:  # every data file written and flushed, the marker not yet
        transaction.write_marker = wait_before_marker
    else:
        full_files.write_pickle = half_write_then_wait
    accelerator.save_state()  # checkpoint_1: killed while its optimizer file is half written, or before its marker


if __name__ == "__main__":
    main()
