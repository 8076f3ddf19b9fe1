"""Helper of tests/checkpointing/test_checkpointing_atomic.py (plain `python`, one process): save a complete checkpoint, then
start a second save whose optimizer file is written only half-way before the process stops and waits to be
killed (SIGKILL by the test), like a job killed in the middle of writing a checkpoint."""
import io
import os
import sys
import time

import torch
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import full_files


def half_write_then_wait(obj, path, **_):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
    print(f"HALF WRITTEN {path}", flush=True)
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
    full_files.write_pickle = half_write_then_wait
    accelerator.save_state()  # checkpoint_1: killed while its optimizer file is half written


if __name__ == "__main__":
    main()
