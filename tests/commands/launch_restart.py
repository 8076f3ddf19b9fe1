"""Run with `hasten launch -n 2 --max_restarts 1`: in the first attempt rank 1 fails after the process group
is up; the agent restarts both processes, and the second attempt must form a fresh group (not read the
first attempt's rendezvous entries, which hangs or fails) and finish."""
import os

import torch
import torch.distributed as dist

from hasten.state import PartialState

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
state = PartialState()
if attempt == 0 and state.process_index == 1:
    raise RuntimeError("deliberate failure in the first attempt")
state.wait_for_everyone()
total = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(total)
assert total.item() == 3.0, total
if state.is_main_process:
    print(f"launch_restart OK after {attempt} restart(s)", flush=True)
state.destroy_process_group()
