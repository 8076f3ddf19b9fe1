"""Latency of hasten's collectives vs the raw torch.distributed calls vs Accelerate, on 2 processes.

    python bench/bench_collectives.py            # launches itself on 2 processes (hasten launch)
    python bench/bench_collectives.py --json out.json

Also measures what the debug-mode mismatch check costs, against the raw collective and against one step of a
small DDP training loop, which decides whether the check may be on by default (rule: on only when it costs
under 2% of such a step; see docs/debugging.md).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))
DEFAULT_BUDGET = 0.02  # the check may stay on by default when it costs less than this share of a small step


def relaunch(argv: list[str], processes: int) -> int:
    """Run this file under `hasten launch`, one benchmark at a time on this machine."""
    command = [sys.executable, "-m", "hasten", "launch", "-n", str(processes), __file__, *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        return subprocess.call(command, env=env)


def timer(variants: dict, calls: int, repeats: int) -> dict:
    """Median over ``repeats`` of the mean time of one call (microseconds) of each variant.

    Variants take turns within every repeat, so a slow spell of the machine hits them all alike; the ranks
    start each timing together.
    """
    import torch.distributed as dist

    samples = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(10):
            fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def with_debug(state, fn, debug: bool):
    """``fn`` run with hasten's mismatch check switched on or off."""

    def call():
        state.debug = debug
        try:
            return fn()
        finally:
            state.debug = False

    return call


def main(args) -> None:
    import torch
    import torch.distributed as dist

    from hasten.state import PartialState
    from hasten.utils import operations as ops

    state = PartialState()
    rank, world, device = state.process_index, state.num_processes, state.device
    try:
        from accelerate.state import PartialState as ReferenceState
        from accelerate.utils import operations as ref

        ReferenceState(cpu=device.type == "cpu")  # Accelerate only goes multi-process on CPU when told cpu=True
    except ImportError:
        ref = None
    calls, repeats = args.calls, args.repeats
    gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    x = torch.randn(64, 16, device=device)
    batch = {"logits": torch.randn(64, 16, device=device), "labels": torch.randint(0, 9, (64,), device=device),
             "mask": torch.ones(64, 8, device=device), "ids": torch.arange(64, device=device)}
    uneven = torch.randn(60 + rank, 16, device=device)
    uneven_batch = {k: v[: 60 + rank] for k, v in batch.items()}

    def raw_gather(tensor):
        out = torch.empty(world * tensor.numel(), dtype=tensor.dtype, device=device)
        gather_flat(out, tensor.contiguous().view(-1))
        return out.view(world * tensor.shape[0], *tensor.shape[1:])

    def raw_pad(tensor):
        sizes = raw_gather(torch.tensor([tensor.shape[0]], device=device))
        largest = int(sizes.max())
        if largest == tensor.shape[0]:
            return tensor
        out = tensor.new_zeros((largest, *tensor.shape[1:]))
        out[: tensor.shape[0]] = tensor
        return out

    def raw_reduce(tensor):
        out = tensor.clone()
        dist.all_reduce(out)
        return out / world

    cases = {
        "gather 64x16": (lambda: raw_gather(x), lambda: ops.gather(x), ref and (lambda: ref.gather(x))),
        "gather dict of 4": (lambda: {k: raw_gather(v) for k, v in batch.items()}, lambda: ops.gather(batch),
                             ref and (lambda: ref.gather(batch))),
        "pad_across_processes 6Xx16": (lambda: raw_pad(uneven), lambda: ops.pad_across_processes(uneven),
                                       ref and (lambda: ref.pad_across_processes(uneven))),
        "pad_across_processes dict of 4": (lambda: {k: raw_pad(v) for k, v in uneven_batch.items()},
                                           lambda: ops.pad_across_processes(uneven_batch),
                                           ref and (lambda: ref.pad_across_processes(uneven_batch))),
        "reduce mean 64x16": (lambda: raw_reduce(x), lambda: ops.reduce(x), ref and (lambda: ref.reduce(x))),
        "reduce sum dict of 4 floats": (lambda: {k: raw_reduce(v.float()) for k, v in batch.items()},
                                        lambda: ops.reduce({k: v.float() for k, v in batch.items()}, "sum"),
                                        ref and (lambda: ref.reduce({k: v.float() for k, v in batch.items()}, "sum"))),
    }
    rows = []
    for name, (raw, ours, theirs) in cases.items():
        variants = {"raw_us": raw, "hasten_us": with_debug(state, ours, False),
                    "hasten_debug_us": with_debug(state, ours, True)}
        if theirs:
            variants["accelerate_us"] = theirs
        rows.append({"case": name, "accelerate_us": None, **timer(variants, calls, repeats)})

    description = ops._describe(batch, ops._full_leaf)
    check = timer({"check": with_debug(state, lambda: ops._check_same_everywhere("gather", batch, state), True),
                   "hash": lambda: ops._signature(ops._describe(batch, ops._full_leaf))}, calls, repeats)
    check_us, hash_us = check["check"], check["hash"]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 128, device=device), torch.randint(0, 10, (32,), device=device)

    def train_step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    step_us = timer({"step": train_step}, calls, repeats)["step"]

    if rank == 0:
        print(f"{world} processes, backend {state.backend}, device {device}; median us per call "
              f"({repeats} x {calls} calls)")
        print(f"{'case':32} {'raw':>8} {'hasten':>8} {'debug':>8} {'accel.':>8} {'hasten/raw':>10} {'hasten/acc':>10}")
        for row in rows:
            acc = row["accelerate_us"]
            print(f"{row['case']:32} {row['raw_us']:8.1f} {row['hasten_us']:8.1f} {row['hasten_debug_us']:8.1f} "
                  f"{acc if acc is not None else float('nan'):8.1f} {row['hasten_us'] / row['raw_us']:10.2f} "
                  f"{(row['hasten_us'] / acc) if acc else float('nan'):10.2f}")
        share = check_us / step_us
        print(f"\nmismatch check alone (hash + 1-int64 all-gather): {check_us:.1f} us, of which hashing "
              f"{description!r}: {hash_us:.1f} us")
        print(f"small DDP step (MLP 128-256-10, batch 32): {step_us:.1f} us")
        print(f"check / step = {share:.1%}; check / raw gather = {check_us / rows[0]['raw_us']:.2f}x")
        decision = "ON by default" if share < DEFAULT_BUDGET else "OFF by default (HASTEN_DEBUG_MODE=1 turns it on)"
        print(f"decision (budget {DEFAULT_BUDGET:.0%} of a small step): mismatch check {decision}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "check_us": check_us, "hash_us": hash_us,
                                                   "step_us": step_us,
                                                   "check_share_of_step": share, "world": world,
                                                   "backend": state.backend, "device": str(device)}, indent=2))
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the numbers to this file (from rank 0)")
    arguments = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit(relaunch(sys.argv[1:], arguments.processes))
    main(arguments)
