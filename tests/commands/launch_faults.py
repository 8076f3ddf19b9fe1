"""Run with `hasten launch -n 2 ... MODE OUT_DIR`: faults that come from outside the Python program.

MODE ``kill_rank1``: after a barrier, rank 1 SIGKILLs itself (what the out-of-memory killer does) while rank 0
waits in a collective; the launcher must blame rank 1 and its SIGKILL, not the rank 0 it stopped.
MODE ``hang``: every rank writes its pid to OUT_DIR/pid-RANK and waits in a collective forever (rank 1 never
joins it), so a test can SIGKILL the launcher and check that no worker outlives it.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from hasten.state import PartialState

mode, out = sys.argv[1], sys.argv[2]
state = PartialState()
rank = state.process_index
with open(os.path.join(out, f"pid-{rank}.tmp"), "w") as handle:
    handle.write(str(os.getpid()))
os.replace(os.path.join(out, f"pid-{rank}.tmp"), os.path.join(out, f"pid-{rank}"))
state.wait_for_everyone()
if mode == "kill_rank1":
    if rank == 1:
        time.sleep(0.2)  # rank 0 is inside the all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))  # never completes: rank 1 is gone
    print("rank 0 finished a collective without rank 1", flush=True)
elif mode == "hang":
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        while True:
            time.sleep(1)
else:
    raise SystemExit(f"unknown mode {mode!r}")
