"""Sharded checkpoints against plain DCP, paired, at several process counts (issue 40).

    python bench/bench_sharded_checkpoint.py [--processes 2 4 8 16] [--pairs 30] [--layers 16] [--width 1024]
    python bench/bench_sharded_checkpoint.py --processes 4 --widths 512 1024 2048   # a model-size axis
    python bench/bench_sharded_checkpoint.py --async_stall [--processes ...]         # async save's stall

One ``hasten launch -n N`` per process count (``worker_launch.py``: under the multi-process tests' lock). In it an FSDP2 model
(``layers`` x Linear(width, width)) with AdamW, after one step, is saved and loaded ``pairs`` times by each variant
in turn, the order alternating pair by pair:

* dcp: plain ``torch.distributed.checkpoint``, ``dcp.save`` of ``get_state_dict(model, optimizer)`` into a new
  folder (DCP's default writer: every file flushed to disk), then ``dcp.load`` of the same and
  ``set_state_dict``;
* hasten: ``Accelerator.save_state`` into a new folder (sharded, DCP underneath: every file flushed, checksummed,
  completion marker, atomic rename, random states) and ``load_state`` of it (read and checked, then applied).

A variant's time is the slowest rank's (each rank times itself between two barriers; the maximum is taken); the
previous folders are removed and the page cache's dirty pages written back (``os.sync``) outside the timing.
Reported per process count: the median of each variant and the median of the per-pair ratios hasten / dcp.
Target: ratio <= 1.1 at every process count, and no worse at 16 than at 2.

``--async_stall``: instead, in each pair, hasten's synchronous ``save_state`` against the time the loop is blocked by
``save_state(async_save=True)`` (from a barrier until the call returns on the slowest process: when every process's
loop goes on; also reported through a barrier after the call, which on this machine's 2 cores also waits for the
background writers of the processes that returned first; the checkpoint is then completed, untimed, with
``wait_for_checkpoint``), and ``async+step``: the same followed at once by the optimizer's step, which waits for the
parameters and moments to be copied (the worst case: a real loop runs a forward and a backward first), and
``dcp async``: torch's own ``dcp.async_save`` of ``get_state_dict(model, optimizer)`` on a gloo group of its own, as
torch's guide shows (until it returns; then ``result()``, untimed), the stall a user of plain DCP gets. Target:
stall <= 0.05x the synchronous save at every process count. Files go to ``BENCH_CHECKPOINT_DIR``
(default: a temporary folder). ``--json PATH`` writes the rows; ``--plot PATH`` draws the ratios against the
number of processes, or with ``--widths`` against the checkpoint's size, or with ``--async_stall`` the stall's
(matplotlib).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_launch import launch_worker  # noqa: E402


def _timed_on_every_rank(function) -> float:
    """Seconds ``function`` took on the slowest rank (a barrier before and after)."""
    return _blocked_on_every_rank(function)[1]


def _blocked_on_every_rank(function) -> tuple[float, float]:
    """``(own, through a barrier)``: the seconds the slowest rank spent in ``function`` (each rank starts after
    the same barrier and stops when ``function`` returns), and the seconds until a barrier after it ends on the
    slowest rank (what a collective right after the call would wait)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    function()
    returned = time.perf_counter() - start
    dist.barrier()
    elapsed = torch.tensor([returned, time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed[0].item()), float(elapsed[1].item())


def worker(out: Path, pairs: int, layers: int, width: int, async_stall: bool = False) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from hasten import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    root = os.environ.get("BENCH_CHECKPOINT_DIR") or tempfile.gettempdir()
    work = accelerator.gather_for_metrics([tempfile.mkdtemp(prefix="hasten-bench-sharded-", dir=root)],
                                          use_gather_object=True)[0]  # the main process's folder, for all

    def fresh(name: str) -> str:
        folder = os.path.join(work, name)
        if accelerator.is_main_process:
            shutil.rmtree(folder, ignore_errors=True)
            os.sync()  # untimed: nobody pays for the writes the previous save left in the page cache
        dist.barrier()
        return folder

    def dcp_save() -> float:
        folder = fresh("dcp")
        return _timed_on_every_rank(lambda: dcp.save(dict(zip(("model", "optim"), get_state_dict(model, optimizer))),
                                                     checkpoint_id=folder))

    def dcp_load() -> float:
        def load():
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optimizer_state}
            dcp.load(state, checkpoint_id=os.path.join(work, "dcp"))
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return _timed_on_every_rank(load)

    def hasten_save() -> float:
        folder = fresh("hasten")
        return _timed_on_every_rank(lambda: accelerator.save_state(folder))

    def hasten_load() -> float:
        return _timed_on_every_rank(lambda: accelerator.load_state(os.path.join(work, "hasten")))

    dcp_group = dist.new_group(backend="gloo") if async_stall else None  # torch's async save: a CPU group of its own

    def dcp_async() -> tuple[float, float]:
        folder = fresh("dcp_async")
        saving: list = []
        stall = _blocked_on_every_rank(lambda: saving.append(dcp.async_save(
            dict(zip(("model", "optim"), get_state_dict(model, optimizer))), checkpoint_id=folder,
            process_group=dcp_group)))
        saving[0].result()  # untimed: written in the background
        return stall

    def hasten_async(then_step: bool) -> tuple[float, float]:
        folder = fresh("hasten_async")
        stall = _blocked_on_every_rank(lambda: (accelerator.save_state(folder, async_save=True),
                                                optimizer.step() if then_step else None))
        accelerator.wait_for_checkpoint()  # untimed: the files are written in the background
        return stall

    def hasten_sync() -> tuple[float, float]:
        folder = fresh("hasten")
        return _blocked_on_every_rank(lambda: accelerator.save_state(folder))

    if async_stall:
        hasten_save(), hasten_async(False), dcp_async()  # warm-up: the first async save allocates its CPU copy
        times = {f"{name}{kind}": [] for name in ("sync", "async", "async_step", "dcp_async")
                 for kind in ("", "_barrier")}
        for pair in range(pairs):
            runs = [("sync", hasten_sync), ("async", lambda: hasten_async(False)),
                    ("async_step", lambda: hasten_async(True)), ("dcp_async", dcp_async)]
            for name, function in runs if pair % 2 == 0 else runs[::-1]:
                own, through_barrier = function()
                times[name].append(own)
                times[f"{name}_barrier"].append(through_barrier)
        if accelerator.is_main_process:
            out.write_text(json.dumps(times))
            shutil.rmtree(work, ignore_errors=True)
        accelerator.wait_for_everyone()
        return
    hasten_save(), dcp_save(), hasten_load(), dcp_load()  # warm-up: imports, first allocations
    times: dict = {name: [] for name in ("dcp_save", "hasten_save", "dcp_load", "hasten_load")}
    for pair in range(pairs):
        order = (("dcp", "hasten") if pair % 2 == 0 else ("hasten", "dcp"))
        for variant in order:
            times[f"{variant}_save"].append((dcp_save if variant == "dcp" else hasten_save)())
        for variant in order:
            times[f"{variant}_load"].append((dcp_load if variant == "dcp" else hasten_load)())
    if accelerator.is_main_process:
        out.write_text(json.dumps(times))
        shutil.rmtree(work, ignore_errors=True)
    accelerator.wait_for_everyone()


def run(processes: int, pairs: int, layers: int, width: int, async_stall: bool = False) -> dict:
    """One launch of ``processes`` ranks; the per-variant times of every pair."""
    return launch_worker(__file__, "sharded", label=f"sharded-{processes}", processes=processes,
                         args=("--pairs", str(pairs), "--layers", str(layers), "--width", str(width),
                               *(("--async_stall",) if async_stall else ())))


def state_megabytes(layers: int, width: int) -> float:
    """The checkpoint's size: the Linear layers' float32 weights and biases, and AdamW's two moments of each."""
    return 3 * layers * (width * width + width) * 4 / 1e6


def summarise(processes: int, times: dict, layers: int, width: int) -> list:
    rows = []
    for operation in ("save", "load"):
        ours, plain = times[f"hasten_{operation}"], times[f"dcp_{operation}"]
        ratios = [a / b for a, b in zip(ours, plain)]
        rows.append({"processes": processes, "operation": operation, "pairs": len(ratios), "width": width,
                     "state_mb": state_megabytes(layers, width),
                     "hasten_median_s": statistics.median(ours), "dcp_median_s": statistics.median(plain),
                     "median_pair_ratio": statistics.median(ratios)})
    return rows


def summarise_async(processes: int, times: dict, layers: int, width: int) -> list:
    """A row per variant: its stall (the slowest process's time in the call) against the synchronous save's, pair
    by pair, and the same measured through a barrier after the call (``..._barrier``)."""
    rows = []
    for variant in ("async", "async_step", "dcp_async"):
        ratios = [a / b for a, b in zip(times[variant], times["sync"])]
        through = [a / b for a, b in zip(times[f"{variant}_barrier"], times["sync_barrier"])]
        row = {"processes": processes, "operation": f"{variant} stall", "pairs": len(ratios), "width": width,
               "state_mb": state_megabytes(layers, width), "hasten_median_s": statistics.median(times[variant]),
               "sync_median_s": statistics.median(times["sync"]), "median_pair_ratio": statistics.median(ratios),
               "barrier_median_s": statistics.median(times[f"{variant}_barrier"]),
               "median_pair_ratio_barrier": statistics.median(through)}
        if variant == "async":  # hasten's stall against plain DCP's asynchronous save's, pair by pair
            row["vs_dcp_async"] = statistics.median(a / b for a, b in zip(times["async"], times["dcp_async"]))
        rows.append(row)
    return rows


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_size = len({row["width"] for row in rows}) > 1  # a model-size axis, at one process count
    figure, axis = plt.subplots(figsize=(5, 3.2))
    for operation in ("save", "load"):
        mine = [row for row in rows if row["operation"] == operation]
        axis.plot([row["state_mb"] if by_size else row["processes"] for row in mine],
                  [row["median_pair_ratio"] for row in mine], marker="o", label=operation)
    axis.axhline(1.1, color="grey", linestyle="--", linewidth=1, label="target 1.1x")
    axis.set_xscale("log", base=2)
    axis.set_xlabel(f"checkpoint size, MB ({rows[0]['processes']} processes, 2 CPU cores)" if by_size
                    else "processes (2 CPU cores)")
    axis.set_ylabel("hasten / plain DCP (median per pair)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_async(rows: list, path: str) -> None:
    """The asynchronous save's stall against the number of processes, each variant's median per-pair ratio to a
    synchronous save, with the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5.4, 4.2))
    lines = [("async stall", "median_pair_ratio", "hasten async: slowest process's call"),
             ("async stall", "median_pair_ratio_barrier", "hasten async: through a barrier after it"),
             ("async_step stall", "median_pair_ratio", "hasten async + the next step at once"),
             ("dcp_async stall", "median_pair_ratio", "torch dcp.async_save")]
    for operation, key, label in lines:
        mine = [row for row in rows if row["operation"] == operation and key in row]
        axis.plot([row["processes"] for row in mine], [row[key] for row in mine], marker="o", label=label)
    axis.axhline(0.05, color="grey", linestyle="--", linewidth=1, label="target 0.05x")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    counts = sorted({row["processes"] for row in rows})
    axis.set_xticks(counts, [str(count) for count in counts])
    axis.set_xlabel("processes (2 CPU cores)")
    axis.set_ylabel("stall / synchronous save (median per pair)")
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--widths", type=int, nargs="+", default=None,
                        help="a model-size axis instead: these widths, at the first of --processes")
    parser.add_argument("--async_stall", action="store_true",
                        help="the stall of save_state(async_save=True) against a synchronous save_state")
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)  # WORKER OUT (worker_launch.py)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        worker(Path(args.worker[1]), args.pairs, args.layers, args.width, args.async_stall)
        return []
    rows = []
    layouts = ([(args.processes[0], width) for width in args.widths] if args.widths
               else [(processes, args.width) for processes in args.processes])
    for processes, width in layouts:
        times = run(processes, args.pairs, args.layers, width, args.async_stall)
        found = (summarise_async if args.async_stall else summarise)(processes, times, args.layers, width)
        for row in found:
            other = ("sync", "sync_median_s") if args.async_stall else ("dcp", "dcp_median_s")
            print(f"{row['processes']:>3} processes  {row['state_mb']:7.0f} MB  {row['operation']}  "
                  f"{'dcp' if row['operation'].startswith('dcp') else 'hasten'} {row['hasten_median_s']:.3f} s  "
                  f"{other[0]} {row[other[1]]:.3f} s  "
                  f"median pair ratio {row['median_pair_ratio']:.3f}x ({row['pairs']} pairs)"
                  + (f"; through a barrier {row['median_pair_ratio_barrier']:.3f}x"
                     if "median_pair_ratio_barrier" in row else "")
                  + (f"; vs dcp async {row['vs_dcp_async']:.2f}x" if "vs_dcp_async" in row else ""), flush=True)
        rows += found
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        (plot_async if args.async_stall else plot)(rows, args.plot)
    # bench/run_all.py's measure rows: a value and a ratio each
    return [{"benchmark": f"{row['operation']} at {row['processes']} processes, {row['state_mb']:.0f} MB",
             "variant": "hasten vs its synchronous save" if args.async_stall else "hasten vs plain DCP",
             "value": f"{row['hasten_median_s']:.3f} s vs {row.get('dcp_median_s', row.get('sync_median_s')):.3f} s",
             "ratio": row["median_pair_ratio"]} for row in rows]


if __name__ == "__main__":
    main()
