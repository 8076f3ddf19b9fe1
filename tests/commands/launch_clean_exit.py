"""Run with `hasten launch -n 2 ... OUT_DIR`: a worker's exit keeps what a normal Python exit guarantees.

An unclosed file is flushed, a non-daemon thread finishes, atexit handlers run, and `sys.exit(3)` on the last
rank becomes the job's exit status — although workers skip the interpreter teardown (see run_script.py).
"""
import atexit
import os
import sys
import threading
import time

import torch
from torch import nn

from hasten import Accelerator

out = sys.argv[1]
accelerator = Accelerator()
model = accelerator.prepare(nn.Linear(4, 4))  # DDP + gloo: the combination whose teardown can abort
accelerator.backward(model(torch.randn(2, 4)).sum())
rank = accelerator.process_index
unclosed = open(os.path.join(out, f"unclosed-{rank}.txt"), "w")
unclosed.write("flushed")


def late_writer():
    time.sleep(0.5)
    with open(os.path.join(out, f"thread-{rank}.txt"), "w") as handle:
        handle.write("joined")


threading.Thread(target=late_writer).start()
atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}.txt"), "w").write("ran"))
if rank == accelerator.num_processes - 1:
    sys.exit(3)
