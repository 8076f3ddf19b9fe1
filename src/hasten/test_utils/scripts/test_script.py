"""Does hasten work on this machine, on any number of processes (Accelerate's ``test_utils.scripts.test_script``)?

Checks, each against values built independently here: the process state against the launcher's variables;
``split_between_processes``; the process decorators; ``main_process_first`` and ``wait_for_everyone`` ordering;
the main-process-only logger; random states synchronised from the main process; prepared data loaders covering
the data set exactly once (``gather_for_metrics`` dropping the padding); and training through ``prepare`` ending
at the parameters of plain single-process PyTorch on the whole batch, with ``split_batches`` off and on and with
gradient accumulation. Run: ``hasten launch -n N <this file>``, or call ``main()`` through ``debug_launcher``.
Any mismatch raises.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import logging

from hasten.logging import get_logger

from hasten.accelerator import Accelerator
from hasten.collectives.random import synchronize_rng_states
from hasten.config.accumulation import GradientAccumulationPlugin
from hasten.config.data import DataLoaderConfiguration
from hasten.config.enums import DistributedType
from hasten.core.env_aliases import get_flag_setting
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.test_utils.training import RegressionDataset, RegressionModel


def all_objects(obj):
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_process_state(state):
    n, rank = state.num_processes, state.process_index
    assert n == int(os.environ.get("WORLD_SIZE", "1")), n
    assert rank == int(os.environ.get("RANK", "0"))
    assert state.local_process_index == int(os.environ.get("LOCAL_RANK", "0"))
    assert state.use_distributed == (n > 1)
    if get_flag_setting("use_deepspeed") and (n > 1 or "LOCAL_RANK" in os.environ):  # a DeepSpeed launch
        assert state.distributed_type == DistributedType.DEEPSPEED, state.distributed_type
    elif n == 1:
        assert state.distributed_type == DistributedType.NO, state.distributed_type
    elif state.device.type == "cpu":
        assert state.distributed_type == DistributedType.MULTI_CPU and state.backend == "gloo", state
    assert state.is_main_process == (rank == 0) and state.is_last_process == (rank == n - 1)
    assert PartialState() is not state and PartialState().process_index == rank  # shared state


def check_splitting_and_ordering(state):
    n, rank = state.num_processes, state.process_index

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



def check_logger(state):
    rank = state.process_index
    # get_logger: main-process-only by default, every process on request, in rank order with in_order
    logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO, force=True)
    logger = get_logger("test_script")
    logger.info("logger-main-only")
    logger.info(f"logger-everyone-{rank}", main_process_only=False)
    for _ in range(3):
        logger.info(f"logger-in-order-{rank}", main_process_only=False, in_order=True)
        sys.stdout.flush()


def check_rng_synchronisation(accelerator):
    """Each process draws differently, then every generator takes the main process's state."""
    torch.manual_seed(1000 + accelerator.process_index)
    generator = torch.Generator().manual_seed(2000 + accelerator.process_index)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    draws = all_objects((torch.rand(3).tolist(), torch.rand(3, generator=generator).tolist()))
    assert all(draw == draws[0] for draw in draws), draws
    torch.manual_seed(1000)
    expected = torch.rand(3).tolist()
    assert draws[0][0] == expected, (draws[0][0], expected)


def check_data_coverage(accelerator):
    """A prepared loader hands every sample to exactly one process; gather_for_metrics drops the padding."""
    n = accelerator.num_processes
    for length, batch_size, shuffle in ((7 * n + 3, 4, False), (64, 8, True), (5, 2, False)):
        loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(length)), batch_size=batch_size,
                                                                 shuffle=shuffle))
        seen = []
        for batch in loader:
            seen.extend(accelerator.gather_for_metrics(batch).tolist())
        if shuffle:
            assert sorted(seen) == list(range(length)), seen
        else:
            assert seen == list(range(length)), seen


def plain_training(data, batch_size, steps_per_update, lr=0.1):
    """Single-process PyTorch: batches of ``batch_size``, an SGD step every ``steps_per_update`` of them."""
    model = RegressionModel(a=1, b=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)
    for index, batch in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]) / steps_per_update
        loss.backward()
        if (index + 1) % steps_per_update == 0 or index + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    return model.a.item(), model.b.item()


def check_training_equivalence(n):
    """``prepare`` + ``backward`` ends where plain PyTorch on the whole batch ends (the data set divides evenly)."""
    data = RegressionDataset(length=32 * n, seed=42)
    for split_batches, accumulation in ((False, 1), (True, 1), (False, 2)):
        AcceleratorState._reset_state()
        GradientState._reset_state()
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split_batches),
                                  gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=accumulation))
        per_process = 8 if split_batches else 4
        loader = torch.utils.data.DataLoader(data, batch_size=per_process * (n if split_batches else 1))
        model = RegressionModel(a=1, b=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        unwrapped = accelerator.unwrap_model(model)
        got = (unwrapped.a.item(), unwrapped.b.item())
        want = plain_training(data, per_process * n, accumulation)
        assert all(abs(g - w) <= 1e-5 * max(1.0, abs(w)) for g, w in zip(got, want)), (
            f"split_batches={split_batches}, accumulation={accumulation}: trained to {got}, plain PyTorch {want}")
        accelerator.free_memory()


def main():
    state = PartialState()
    check_process_state(state)
    check_splitting_and_ordering(state)
    check_logger(state)
    accelerator = Accelerator()
    check_rng_synchronisation(accelerator)
    check_data_coverage(accelerator)
    check_training_equivalence(state.num_processes)
    n = state.num_processes
    state.print(f"test_script OK on {n} process{'es' if n > 1 else ''}")
    state.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
