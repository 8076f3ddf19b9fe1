"""Run with `hasten launch`: what the launcher promises each process, checked from inside the processes.

    hasten launch -n N [flags] check_launch_env.py --world N [--env KEY=VALUE ...] [--threads T]
                                                   [--module-name NAME] [--label TEXT]

`--env KEY=` (empty value) means KEY must not be set. Prints "check_launch_env OK ..." on rank 0.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

from hasten.config.enums import DistributedType
from hasten.state import PartialState


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--threads", type=int)
    parser.add_argument("--module-name")
    parser.add_argument("--label")
    return parser.parse_args()


def main():
    options = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == options.world, f"WORLD_SIZE={world}, expected {options.world}"
    assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["LOCAL_WORLD_SIZE"] == str(world), dict(os.environ)

    # run as the user's __main__, with the argv / sys.path / spec that plain python would give
    assert __name__ == "__main__", __name__
    assert os.path.abspath(sys.argv[0]) == os.path.abspath(__file__), (sys.argv, __file__)
    if options.module_name:
        assert __spec__ is not None and __spec__.name == options.module_name, __spec__
        assert os.path.abspath(sys.path[0]) == os.getcwd(), (sys.path[0], os.getcwd())
    else:
        assert os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)), sys.path[0]
    if options.label is not None:
        assert options.label == "two words", repr(options.label)

    # settings handed down by the launcher
    for item in options.env:
        key, _, expected = item.partition("=")
        actual = os.environ.get(key)
        if expected:
            assert actual == expected, f"{key}={actual!r}, expected {expected!r}"
        else:
            assert actual is None, f"{key} should be unset, got {actual!r}"
    if options.threads is not None:
        assert os.environ["OMP_NUM_THREADS"] == str(options.threads), os.environ.get("OMP_NUM_THREADS")
        assert torch.get_num_threads() == options.threads, torch.get_num_threads()

    # the process state sees a real multi-process CPU job
    state = PartialState()
    assert state.num_processes == world and state.process_index == rank, state
    assert state.distributed_type == DistributedType.MULTI_CPU and state.backend == "gloo", state
    ranks = [None] * world
    dist.all_gather_object(ranks, (rank, os.getpid()))
    assert [r for r, _ in ranks] == list(range(world)), ranks
    assert len({pid for _, pid in ranks}) == world, f"expected {world} distinct processes: {ranks}"
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) / 2, total
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"check_launch_env OK: {world} processes, MULTI_CPU, port {os.environ['MASTER_PORT']}", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
