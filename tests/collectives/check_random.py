"""Multi-process checks of hasten.utils.random (run with 2+ processes by tests/collectives/test_random_distributed.py)."""
import random

import numpy as np
import torch
import torch.distributed as dist

from hasten.config.enums import RNGType
from hasten.state import PartialState
from hasten.utils import set_seed, synchronize_rng_state, synchronize_rng_states


def all_equal(tensor: torch.Tensor) -> bool:
    """Whether every process holds the same values (compared on process 0's terms, answer shared)."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return all(torch.equal(gathered[0], other) for other in gathered)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def main():
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    check(world >= 2 and dist.is_initialized(), "needs a process group of 2+ processes")

    # 1. torch RNG: different seeds, then process 0's state everywhere; process 0's own stream unchanged.
    torch.manual_seed(1000 + rank)
    check(not all_equal(torch.rand(4)), "differently seeded processes should draw differently")
    torch.manual_seed(1000 + rank)
    own_state = torch.get_rng_state()
    synchronize_rng_state("torch")
    after_sync = torch.rand(6)
    check(all_equal(after_sync), "torch RNG not synchronised")
    if rank == 0:
        torch.set_rng_state(own_state)
        check(torch.equal(torch.rand(6), after_sync), "process 0's torch RNG state should not change")

    # 2. A torch.Generator, passed as RNGType.
    generator = torch.Generator().manual_seed(rank)
    synchronize_rng_state(RNGType.GENERATOR, generator=generator)
    check(all_equal(torch.randperm(20, generator=generator)), "generator not synchronised")

    # 3. Several at once, mixed str / RNGType.
    torch.manual_seed(rank + 50)
    generator = torch.Generator().manual_seed(rank + 60)
    synchronize_rng_states(["torch", RNGType.GENERATOR], generator=generator)
    check(all_equal(torch.rand(3)), "torch RNG not synchronised by synchronize_rng_states")
    check(all_equal(torch.rand(3, generator=generator)), "generator not synchronised by synchronize_rng_states")
    expected_generator = torch.Generator().manual_seed(60)  # process 0's seed
    generator = torch.Generator().manual_seed(rank + 60)
    synchronize_rng_states([RNGType.GENERATOR], generator=generator)
    check(torch.equal(torch.rand(3, generator=generator), torch.rand(3, generator=expected_generator)),
          "generator should hold process 0's state")

    # 4. CUDA RNG when every process has a GPU.
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        torch.cuda.manual_seed(rank + 7)
        synchronize_rng_state("cuda")
        check(all_equal(torch.rand(3, device=state.device).cpu()), "cuda RNG not synchronised")

    # 5. set_seed: same everywhere by default, offset by the process index with device_specific.
    set_seed(42)
    check(all_equal(torch.rand(3)), "set_seed(42) should give every process the same torch stream")
    set_seed(42, device_specific=True)
    mine = (random.random(), float(np.random.rand()), torch.rand(2))
    random.seed(42 + rank)
    np.random.seed(42 + rank)
    torch.manual_seed(42 + rank)
    check(mine[0] == random.random() and mine[1] == float(np.random.rand()) and torch.equal(mine[2], torch.rand(2)),
          "device_specific should seed with 42 + process index")
    check(not all_equal(mine[2]), "device_specific seeds should differ between processes")

    state.wait_for_everyone()
    if rank == 0:
        print("ALL RANDOM CHECKS PASSED", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
