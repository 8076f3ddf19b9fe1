"""Gradient synchronisation on any number of processes (Accelerate's ``test_utils.scripts.test_sync``), many times
over to catch rank-divergent collectives.

The scenarios of the reference library's ``test_sync.py`` (written here with a small local model and data
set): ``no_sync``, ``no_sync`` with several forwards then ``trigger_sync_in_backward``, ``accumulate`` up to
the end of the data loader, and ``accumulate`` with a prepared optimizer and scheduler, for every
``split_batches`` x ``dispatch_batches`` x ``sync_each_batch``; plus collectives next to a condition local to
each process (a log level set per process) and empty tensors. Every collective hasten issues must be entered by
all processes whatever the timing; one that is not hangs here (the caller's timeout turns that into a
failure; ``faulthandler`` then prints every thread's stack, so the log says which collective each rank is in).

On one process the same scenarios check that ``no_sync`` and ``accumulate`` change nothing: the gradients always
equal the plain model's. Run: ``hasten launch -n 2 <this file> [rounds]`` (10 rounds by default), or call
``main(rounds)`` (one round by default) directly or through ``debug_launcher``. ``HASTEN_STRESS_DUMP_AFTER`` (seconds, default 30): how long one round may take before
the stacks are dumped.
"""
import faulthandler
import logging
import sys
import time
from copy import deepcopy

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.config.accumulation import GradientAccumulationPlugin
from hasten.config.data import DataLoaderConfiguration
from hasten.core.env_aliases import get_setting
from hasten.logging import get_logger
from hasten.state import AcceleratorState, GradientState, PartialState

LENGTH, BATCH = 80, 16


class LineData(Dataset):
    """``y = 2x + 3`` plus noise. Each process has its own samples (as with the reference's unseeded data set),
    but they are seeded: the round-off between the DDP average and the single-process gradient is then the
    same in every run (with unseeded data the reference's exact ``allclose`` fails now and then)."""

    def __init__(self, length=LENGTH, seed=None):
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else 1234 + PartialState().process_index)
        self.x = torch.randn(length, generator=generator)
        self.y = 2 * self.x + 3 + 0.1 * torch.randn(length, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class Line(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.0))
        self.b = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, x):
        return x * self.a + self.b


def step_model(model, x, y, accelerator, do_backward=True):
    model.train()
    loss = F.mse_loss(model(x), y.to(x.device))
    if not do_backward:
        (loss / accelerator.gradient_accumulation_steps).backward()
    else:
        accelerator.backward(loss)


def check_grads(model_a, model_b, synced, where, **tolerance):
    """Gradients equal up to round-off when ``synced``; different (exact comparison) otherwise. One process has
    nothing to synchronise: its gradients are always the plain model's."""
    synced = synced or PartialState().num_processes == 1
    if synced:
        tolerance.setdefault("atol", 1e-6)
    pairs = zip(model_a.parameters(), model_b.parameters())
    same = all(torch.allclose(p.grad, q.grad, **(tolerance if synced else {})) for p, q in pairs)
    assert same == synced, f"{where}: gradients {'differ' if synced else 'are in sync'} but should not"


def setup(accelerator, sched=False):
    set_seed(42)
    model = Line()
    ddp_model = deepcopy(model)
    loader = DataLoader(LineData(), batch_size=BATCH)
    if not sched:
        ddp_model, loader = accelerator.prepare(ddp_model, loader)
        return model, ddp_model, loader
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda epoch: epoch ** 0.65)
    ddp_sch = torch.optim.lr_scheduler.LambdaLR(ddp_opt, lr_lambda=lambda epoch: epoch ** 0.65)
    ddp_model, ddp_opt, ddp_sch, loader = accelerator.prepare(ddp_model, ddp_opt, ddp_sch, loader)
    return model, opt, sch, loader, ddp_model, ddp_opt, ddp_sch


def fresh_accelerator(**kwargs):
    GradientState._reset_state()
    return Accelerator(**kwargs)


def dataloader_break(accelerator):
    first, second = accelerator.prepare(DataLoader(LineData(80), batch_size=16),
                                        DataLoader(LineData(96), batch_size=16))
    state = accelerator.gradient_state
    assert state.active_dataloader is None
    for i, _ in enumerate(first):
        assert state.active_dataloader is first
        assert state.end_of_dataloader == (i == len(first) - 1)
        if i == 1:
            for j, _ in enumerate(second):
                assert state.active_dataloader is second
                assert state.end_of_dataloader == (j == len(second) - 1)
    assert state.active_dataloader is None


def distributed_sync(accelerator):
    model, ddp_model, loader = setup(accelerator)
    x, y = next(iter(loader)).values()
    for iteration in range(3):
        gx, gy = accelerator.gather((x, y))
        step_model(model, gx, gy, accelerator)
        if iteration % 2 == 0:
            with accelerator.no_sync(ddp_model):
                step_model(ddp_model, x, y, accelerator)
        else:
            step_model(ddp_model, x, y, accelerator)
        check_grads(model, ddp_model, iteration % 2 == 1, f"no_sync, iteration {iteration}")
        torch.manual_seed(1337 + iteration)
        x = x[torch.randperm(len(x))]


def distributed_sync_multiple_fwd(accelerator):
    model, ddp_model, loader = setup(accelerator)
    losses = []
    for _ in range(3):
        x, y = next(iter(loader)).values()
        gx, gy = accelerator.gather((x, y))
        step_model(model, gx, gy, accelerator)
        with accelerator.no_sync(ddp_model):
            losses.append(F.mse_loss(ddp_model(x), y))
    for iteration, loss in enumerate(losses):
        if iteration < len(losses) - 1:
            accelerator.backward(loss)
            if accelerator.num_processes > 1:  # one process: the plain model has all three batches' sums already
                check_grads(model, ddp_model, False, f"multiple forwards, iteration {iteration}")
        else:
            with accelerator.trigger_sync_in_backward(ddp_model):
                accelerator.backward(loss)
            check_grads(model, ddp_model, True, "multiple forwards, last backward")


def gradient_accumulation(split_batches, dispatch_batches, sync_each_batch):
    accelerator = fresh_accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=sync_each_batch),
    )
    model, ddp_model, loader = setup(accelerator)
    for iteration, batch in enumerate(loader):
        x, y = batch.values()
        gx, gy = accelerator.gather((x, y))
        step_model(model, gx, gy, accelerator, False)
        with accelerator.accumulate(ddp_model):
            step_model(ddp_model, x, y, accelerator)
        synced = (iteration + 1) % 2 == 0 or iteration == len(loader) - 1 or sync_each_batch
        check_grads(model, ddp_model, synced, f"accumulate, iteration {iteration}")
    GradientState._reset_state()


def gradient_accumulation_with_opt_and_scheduler(split_batches, dispatch_batches, sync_each_batch):
    accelerator = fresh_accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=sync_each_batch),
    )
    model, opt, sch, loader, ddp_model, ddp_opt, ddp_sch = setup(accelerator, sched=True)
    for iteration, batch in enumerate(loader):
        x, y = batch.values()
        gx, gy = accelerator.gather((x, y))
        model.train()
        ddp_model.train()
        step_model(model, gx, gy, accelerator, False)
        opt.step()
        did_step = (iteration + 1) % 2 == 0 or (iteration + 1) == len(loader)
        if did_step:
            for _ in range(1 if split_batches else accelerator.num_processes):
                sch.step()
        with accelerator.accumulate(ddp_model):
            step_model(ddp_model, x, y, accelerator)
            ddp_opt.step()
            ddp_sch.step()
        assert opt.param_groups[0]["lr"] == ddp_opt.param_groups[0]["lr"], f"learning rates differ at {iteration}"
        synced = did_step or sync_each_batch  # in sync up to round-off; out of sync exactly otherwise
        if synced or accelerator.num_processes > 1:  # one process: the plain optimizer stepped on partial sums
            check_grads(model, ddp_model, synced, f"accumulate + optimizer, iteration {iteration}", rtol=1e-2)
        if did_step:
            opt.zero_grad()
        ddp_opt.zero_grad()
        torch.manual_seed(1337 + iteration)
    GradientState._reset_state()


def rank_local_conditions(accelerator):
    """Collectives next to a condition that is local to each process: they must still be entered by all."""
    # Empty tensors (on every process: shapes must match) come back empty, with the processes still in step.
    gathered = accelerator.gather(torch.empty(0, 3))
    assert gathered.shape == (0, 3), gathered.shape
    assert accelerator.reduce(torch.empty(0), reduction="sum").shape == (0,)
    # A log level that differs between processes: the in_order barriers are entered by all of them anyway.
    logger = get_logger("hasten.test_sync")
    logger.logger.setLevel(logging.INFO if accelerator.is_main_process else logging.ERROR)
    logger.info("in order, printed by process 0 only", main_process_only=False, in_order=True)
    assert accelerator.gather(torch.tensor([accelerator.process_index])).tolist() == list(
        range(accelerator.num_processes))


COMBINATIONS = [(s, d, e) for s in (True, False) for d in (True, False) for e in (True, False)]


def one_round(accelerator):
    rank_local_conditions(accelerator)
    dataloader_break(accelerator)
    distributed_sync(accelerator)
    distributed_sync_multiple_fwd(accelerator)
    for combination in COMBINATIONS:
        gradient_accumulation(*combination)
    for combination in COMBINATIONS:
        gradient_accumulation_with_opt_and_scheduler(*combination)


def main(iterations=None):
    """``iterations`` rounds of every scenario (the command line's first argument, else 10, when run as a script;
    one when called without it)."""
    if iterations is None:
        iterations = 1
    # A hang becomes readable: every thread's stack goes to stderr if we are still here after this long.
    logging.getLogger("hasten").setLevel(logging.ERROR)  # the once-per-Accelerator scheduler note, x 100
    dump_after = float(get_setting("stress_dump_after", "30"))
    try:
        AcceleratorState._reset_state()
        GradientState._reset_state()
        accelerator = Accelerator()
        start = time.perf_counter()
        for _ in range(iterations):
            # A round takes well under a second: one still running after `dump_after` s is stuck in a collective.
            faulthandler.dump_traceback_later(dump_after, exit=False)
            one_round(accelerator)
            accelerator = fresh_accelerator()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            print(f"test_sync OK: {iterations} rounds on {accelerator.num_processes} processes in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
    finally:
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
