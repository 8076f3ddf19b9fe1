"""Run with `hasten launch -n N`: process state, splitting, decorators and ordering across real processes."""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import logging

from hasten.logging import get_logger

from hasten.config.enums import DistributedType
from hasten.state import PartialState


def all_objects(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def main():
    state = PartialState()
    n, rank = state.num_processes, state.process_index
    assert n == int(os.environ["WORLD_SIZE"]) >= 2, n
    assert rank == int(os.environ["RANK"]) and state.local_process_index == int(os.environ["LOCAL_RANK"])
    assert state.distributed_type == DistributedType.MULTI_CPU and state.backend == "gloo"
    assert state.use_distributed and state.device.type == "cpu"
    assert state.is_main_process == (rank == 0) and state.is_last_process == (rank == n - 1)
    assert PartialState() is not state and PartialState().process_index == rank  # shared state

    # split_between_processes: every element exactly once, in order, across the real processes
    for length in (0, 1, n - 1, n, 2 * n + 1, 7):
        data = list(range(length))
        with state.split_between_processes(data) as share:
            shares = all_objects(share)
        assert [x for s in shares for x in s] == data, (length, shares)
        with state.split_between_processes(torch.arange(length), apply_padding=True) as share:
            padded = all_objects(share)
        if length:
            assert len({len(s) for s in padded}) == 1, padded
            real = torch.cat([p[: len(s)] for p, s in zip(padded, shares)])
            assert torch.equal(real, torch.arange(length)), padded
            assert all(int(x) == length - 1 for p, s in zip(padded, shares) for x in p[len(s):])
    with state.split_between_processes({"x": list(range(5)), "y": torch.arange(5)}, apply_padding=True) as share:
        shares = all_objects(share)
    assert len({len(s["x"]) for s in shares}) == 1 and all(len(s["x"]) == len(s["y"]) for s in shares)

    # decorators run on the right process only
    ran = []
    state.on_main_process(lambda: ran.append("main"))()
    state.on_last_process(lambda: ran.append("last"))()
    state.on_local_main_process(lambda: ran.append("local-main"))()
    state.on_process(process_index=1)(lambda: ran.append("one"))()
    state.on_local_process(local_process_index=n - 1)(lambda: ran.append("local-last"))()
    everyone = all_objects(ran)
    local = [int(x) for x in all_objects(os.environ["LOCAL_RANK"])]
    for r, got in enumerate(everyone):  # expected in call order, from each rank's own facts
        expected = [name for name, runs in (("main", r == 0), ("last", r == n - 1), ("local-main", local[r] == 0),
                                            ("one", r == 1), ("local-last", local[r] == n - 1)) if runs]
        assert got == expected, (r, got, expected)

    # main_process_first: the main process finishes its block before any other process enters its own
    folder = all_objects(tempfile.mkdtemp() if rank == 0 else None)[0]
    marker = os.path.join(folder, "main-done")
    with state.main_process_first():
        if rank == 0:
            time.sleep(0.5)
            with open(marker, "w") as handle:
                handle.write("done")
        else:
            assert os.path.exists(marker), "a process entered main_process_first before the main process left"
    with state.local_main_process_first():
        if not state.is_local_main_process:
            assert os.path.exists(marker)

    # wait_for_everyone really waits
    start = time.time()
    if rank == 0:
        time.sleep(0.5)
    state.wait_for_everyone()
    assert time.time() - start >= 0.45

    # get_logger: main-process-only by default, every process on request, in rank order with in_order
    logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO, force=True)
    logger = get_logger("check_state")
    logger.info("logger-main-only")
    logger.info(f"logger-everyone-{rank}", main_process_only=False)
    for _ in range(3):
        logger.info(f"logger-in-order-{rank}", main_process_only=False, in_order=True)
        sys.stdout.flush()

    state.print(f"check_state OK on {n} processes")
    state.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
