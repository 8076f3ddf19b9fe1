"""Latency of hasten's collectives, checked (the default) and unchecked, vs raw torch.distributed vs Accelerate.

    python bench/bench_collectives.py            # launches itself on 2 processes (hasten launch)
    python bench/bench_collectives.py --json out.json

hasten's collectives check by default that every process passed matching inputs (one small header
all-gather, or none where the call exchanges sizes anyway; see docs/debugging.md). This measures that check
per call, and as a share of a realistic evaluation loop: examples/demo.py's evaluation (prepared model and
uneven evaluation loader, `gather_for_metrics` of predictions and labels per batch).
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


def relaunch(argv: list[str], processes: int) -> int:
    """Run this file under `hasten launch`, one benchmark at a time on this machine."""
    command = [sys.executable, "-m", "hasten", "launch", "-n", str(processes), __file__, *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        return subprocess.call(command, env=env)


def timer(variants: dict, calls: int, repeats: int) -> dict:
    """Per variant: the median over ``repeats`` of the mean time of one call (microseconds), the median of
    the paired ratios to the first variant (same repeat), and the samples.

    Variants take turns within every repeat, so a slow spell of the machine hits them all alike; the ranks
    start each timing together.
    """
    import torch.distributed as dist

    samples = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(3):
            fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    base = next(iter(samples.values()))
    return {name: (statistics.median(values), statistics.median(v / b for v, b in zip(values, base)), values)
            for name, values in samples.items()}


def paired(a: list, b: list) -> float:
    """Median of the ratios a/b of samples taken in the same repeat."""
    return statistics.median(x / y for x, y in zip(a, b))


def checks(fn, on: bool):
    """``fn`` run with hasten's agreement checks switched on or off."""
    from hasten.utils.operations import set_collective_checks

    def call():
        set_collective_checks(on)
        try:
            return fn()
        finally:
            set_collective_checks(None)

    return call


def main(args) -> None:
    import torch
    import torch.distributed as dist

    from hasten.state import PartialState
    from hasten.collectives import operations as ops
    from hasten.collectives import checks as cc

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
    xl = torch.randn(512, 16, device=device)
    batch = {"logits": torch.randn(64, 16, device=device), "labels": torch.randint(0, 9, (64,), device=device),
             "mask": torch.ones(64, 8, device=device), "ids": torch.arange(64, device=device)}
    uneven = torch.randn(60 + rank, 16, device=device)
    uneven_batch = {k: v[: 60 + rank] for k, v in batch.items()}
    metrics = (torch.randint(0, 2, (50,), device=device), torch.randint(0, 2, (50,), device=device))

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

    def raw_broadcast(tensor):
        dist.broadcast(tensor, src=0)
        return tensor

    def raw_objects(obj):
        out = [None] * world
        dist.all_gather_object(out, obj)
        return out

    def raw_broadcast_objects(objects):
        dist.broadcast_object_list(objects, src=0)
        return objects

    payload = [{"id": i, "text": f"sample {i}"} for i in range(16)]
    cases = {  # name: (raw torch, hasten, Accelerate or None)
        "gather 64x16": (lambda: raw_gather(x), lambda: ops.gather(x), ref and (lambda: ref.gather(x))),
        "gather 512x16 (32 KiB: header + data)": (lambda: raw_gather(xl), lambda: ops.gather(xl),
                                                   ref and (lambda: ref.gather(xl))),
        "gather dict of 4": (lambda: {k: raw_gather(v) for k, v in batch.items()}, lambda: ops.gather(batch),
                             ref and (lambda: ref.gather(batch))),
        "gather_for_metrics 2x50 (hasten=gather path)": (lambda: [raw_gather(t) for t in metrics],
                                                        lambda: ops._gather(metrics, "gather_for_metrics"),
                                                        ref and (lambda: ref.gather(metrics))),
        "pad_across_processes 6Xx16": (lambda: raw_pad(uneven), lambda: ops.pad_across_processes(uneven),
                                       ref and (lambda: ref.pad_across_processes(uneven))),
        "pad_across_processes dict of 4": (lambda: {k: raw_pad(v) for k, v in uneven_batch.items()},
                                           lambda: ops.pad_across_processes(uneven_batch),
                                           ref and (lambda: ref.pad_across_processes(uneven_batch))),
        "reduce mean 64x16": (lambda: raw_reduce(x), lambda: ops.reduce(x), ref and (lambda: ref.reduce(x))),
        "reduce sum dict of 4 floats": (lambda: {k: raw_reduce(v.float()) for k, v in batch.items()},
                                        lambda: ops.reduce({k: v.float() for k, v in batch.items()}, "sum"),
                                        ref and (lambda: ref.reduce({k: v.float() for k, v in batch.items()}, "sum"))),
        "broadcast 64x16": (lambda: raw_broadcast(x), lambda: ops.broadcast(x), ref and (lambda: ref.broadcast(x))),
        "gather_object list of 16 dicts": (lambda: raw_objects(payload), lambda: ops.gather_object(payload),
                                           ref and (lambda: ref.gather_object(payload))),
        "broadcast_object_list 16 dicts": (lambda: raw_broadcast_objects(list(payload)),
                                           lambda: ops.broadcast_object_list(list(payload)),
                                           ref and (lambda: ref.broadcast_object_list(list(payload)))),
    }
    rows = []
    for name, (raw, ours, theirs) in cases.items():
        variants = {"raw": raw, "unchecked": checks(ours, False), "checked": checks(ours, True)}
        if theirs:
            variants["accelerate"] = theirs
        timed = timer(variants, calls, repeats)
        rows.append({"case": name, **{f"{k}_us": v[0] for k, v in timed.items()},
                     **{f"{k}_vs_raw": v[1] for k, v in timed.items()},
                     "checked_vs_unchecked": paired(timed["checked"][2], timed["unchecked"][2])})

    # uneven first dimension: hasten's gather takes it as it is; the others need pad, gather, trim
    def pad_gather_trim(gather_fn, pad_fn, tensor):
        sizes = gather_fn(torch.tensor([tensor.shape[0]], device=device)).tolist()
        padded = gather_fn(pad_fn(tensor)).view(world, -1, *tensor.shape[1:])
        return torch.cat([padded[r, :size] for r, size in enumerate(sizes)])

    variants = {"raw": lambda: pad_gather_trim(raw_gather, raw_pad, uneven),
                "checked": checks(lambda: ops.gather(uneven), True)}
    if ref:
        variants["accelerate"] = lambda: pad_gather_trim(ref.gather, ref.pad_across_processes, uneven)
    timed = timer(variants, calls, repeats)
    rows.append({"case": "gather 6Xx16, uneven dim 0", **{f"{k}_us": v[0] for k, v in timed.items()},
                 **{f"{k}_vs_raw": v[1] for k, v in timed.items()}})

    check = timer({"check": lambda: cc.check_same_everywhere("gather", batch, state),  # header only, no data
                   "hash": lambda: cc.signature(cc.describe(batch, cc.gather_leaf))}, calls, repeats)
    check_us, hash_us = check["check"][0], check["hash"][0]

    evaluation = evaluation_share(args, device)

    if rank == 0:
        print(f"{world} processes, backend {state.backend}, device {device}; median us per call "
              f"({repeats} x {calls} calls); x: median of paired ratios to raw torch")
        print(f"{'case':44} {'raw':>7} {'unchecked':>16} {'checked':>16} {'accelerate':>16} {'chk/unchk':>9}")

        def cell(row, key):
            if row.get(f"{key}_us") is None:
                return f"{'-':>16}"
            return f"{row[f'{key}_us']:7.0f} ({row[f'{key}_vs_raw']:5.2f}x)"

        for row in rows:
            ratio = row.get("checked_vs_unchecked")
            print(f"{row['case']:44} {row['raw_us']:7.0f} {cell(row, 'unchecked')} {cell(row, 'checked')} "
                  f"{cell(row, 'accelerate')} {ratio if ratio else float('nan'):9.2f}")
        print(f"\ncheck alone (hash + one header all-gather, no data in it): {check_us:.0f} us, of which hashing "
              f"{cc.describe(batch, cc.gather_leaf)!r}: {hash_us:.1f} us")
        print(f"evaluation loop (examples/demo.py: {evaluation['batches']} batches per process, gather_for_metrics "
              f"of (predictions, labels)): unchecked {evaluation['unchecked_ms']:.1f} ms, checked "
              f"{evaluation['checked_ms']:.1f} ms per pass; checked/unchecked = {evaluation['ratio']:.3f} "
              f"(median of {evaluation['repeats']} paired passes)")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "check_us": check_us, "hash_us": hash_us,
                                                   "evaluation": evaluation, "world": world,
                                                   "backend": state.backend, "device": str(device)}, indent=2))
    state.wait_for_everyone()
    state.destroy_process_group()


def evaluation_share(args, device) -> dict:
    """One evaluation pass of examples/demo.py (trained model not needed: the cost is the same), checked vs
    unchecked, alternated pass by pass."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(ROOT / "examples"))
    from demo import spirals

    from hasten import Accelerator
    from hasten.utils import set_seed

    accelerator = Accelerator(mixed_precision="bf16")
    set_seed(0)
    model = nn.Sequential(nn.Linear(2, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 2))
    evaluate = DataLoader(spirals(1001, seed=1), batch_size=100)
    model, evaluate = accelerator.prepare(model, evaluate)
    model.eval()

    def one_pass():
        correct = total = 0
        for x, y in evaluate:
            with torch.no_grad():
                predictions = model(x).argmax(-1)
            predictions, y = accelerator.gather_for_metrics((predictions, y))
            correct += int((predictions == y).sum())
            total += len(y)
        assert total == 1001, total
        return correct

    passes = {"unchecked": checks(one_pass, False), "checked": checks(one_pass, True)}
    times = {name: [] for name in passes}
    for fn in passes.values():
        fn()
    for _ in range(args.eval_repeats):
        for name, fn in passes.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    ratio = statistics.median(c / u for c, u in zip(times["checked"], times["unchecked"]))
    return {"unchecked_ms": statistics.median(times["unchecked"]), "checked_ms": statistics.median(times["checked"]),
            "ratio": ratio, "repeats": args.eval_repeats, "batches": len(evaluate)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--eval-repeats", dest="eval_repeats", type=int, default=21)
    parser.add_argument("--json", help="also write the numbers to this file (from rank 0)")
    arguments = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit(relaunch(sys.argv[1:], arguments.processes))
    main(arguments)
