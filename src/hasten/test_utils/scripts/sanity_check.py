"""The script ``hasten test`` launches: does a multi-process job work on this machine?

Every process checks the process state against the launcher's variables, then the processes exchange
data (an all-gather of their ranks, a broadcast from the main process) and meet at a barrier. Any
mismatch raises, so the launch fails with the failing rank's traceback.
"""
import os

import torch
import torch.distributed as dist

from hasten.state import PartialState


def check(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(f"hasten sanity check failed: {message}")


def main() -> None:
    state = PartialState()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    check(state.num_processes == world, f"PartialState sees {state.num_processes} processes, WORLD_SIZE={world}")
    check(state.process_index == rank, f"PartialState says process {state.process_index}, RANK={rank}")
    if world > 1:
        check(state.use_distributed, f"{world} processes but distributed_type={state.distributed_type}")
        ranks = [torch.zeros(1, dtype=torch.int64, device=state.device) for _ in range(world)]
        dist.all_gather(ranks, torch.tensor([rank], device=state.device))
        check([int(t.item()) for t in ranks] == list(range(world)), f"all_gather returned {ranks}")
        token = torch.tensor([12345 if state.is_main_process else -1], device=state.device)
        dist.broadcast(token, src=0)
        check(int(token.item()) == 12345, f"broadcast from process 0 delivered {token.item()}")
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"hasten sanity check passed: {world} process(es), {state.distributed_type.value}, "
              f"backend {state.backend or 'none'}, device {state.device}", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
