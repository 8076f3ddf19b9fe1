"""Big-model inference, side by side: plain PyTorch, hasten and Accelerate (when installed).

    python bench/bench_big_modeling.py            # all three benchmarks (~0.8 GB written to a temp folder)
    python bench/bench_big_modeling.py --only plan
    python bench/bench_big_modeling.py --only load --pairs 30 --json bench/big_model_loading.json

1. ``load``: ``load_checkpoint_and_dispatch`` of a ~0.8 GB safetensors file onto the CPU, into a model built on
   the meta device, then one forward (which reads every weight): the time of both together, and the peak RSS
   they add to the process (as a multiple of the file size). Four cases: weights kept in their file dtype
   (float32) or converted on load (``dtype=torch.bfloat16``), with the file in the page cache ("warm") or evicted
   from it first ("cold", ``posix_fadvise(DONTNEED)``). Plain PyTorch: ``safetensors.torch.load_file``
   (+ ``.to(dtype)``) and ``load_state_dict(assign=True)``. Each round runs every variant once per case in
   turn, in a fresh process, the order rotating; reported: the median of the per-round ratios.
2. ``plan``: ``infer_auto_device_map`` of a 12,000-module model (baseline: Accelerate).
3. ``offload``: a forward pass with half of the blocks on disk: the output must equal the fully loaded model's,
   and the peak RSS (loading + forward) must stay well below the model size.

Loads run in fresh processes (peak RSS is per process), variants take turns, medians are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from harness import compare, format_table, is_installed, peak_rss, reset_peak_rss  # noqa: E402

WIDTH, BLOCKS = 2048, 24  # 24 blocks x 2 Linear(2048, 2048): 201M float32 parameters, ~0.8 GB


# ------------------------------------------------------------------ the models
def _nn():
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc1 = nn.Linear(d, d)
            self.fc2 = nn.Linear(d, d)

        def forward(self, x):
            return x + self.fc2(self.fc1(x).relu()) * 0.1

    class BigModel(nn.Module):
        def __init__(self, d=WIDTH, blocks=BLOCKS):
            super().__init__()
            self.blocks = nn.ModuleList([Block(d) for _ in range(blocks)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    return BigModel


def half_on_disk_map() -> dict:
    return {f"blocks.{i}": ("cpu" if i < BLOCKS // 2 else "disk") for i in range(BLOCKS)}


def write_checkpoint(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = _nn()()
    path = folder / "model.safetensors"
    save_file(model.state_dict(), path, metadata={"format": "pt"})
    torch.manual_seed(1)
    torch.save(torch.randn(4, WIDTH), folder / "input.pt")
    return path


# ------------------------------------------------------------------ child processes (one measurement each)
def _empty_model(variant: str):
    BigModel = _nn()
    if variant == "accelerate":
        from accelerate import init_empty_weights
    elif variant == "hasten":
        from hasten import init_empty_weights
    else:
        import torch

        with torch.device("meta"):
            return BigModel()
    with init_empty_weights():
        return BigModel()


def _loader(variant: str):
    """The variant's load function, imported before any timing starts (imports are not loading)."""
    if variant == "torch":
        from safetensors.torch import load_file

        def load(model, checkpoint, device_map, offload_folder=None, dtype=None):
            state = load_file(checkpoint)
            if dtype is not None:
                state = {name: tensor.to(dtype) for name, tensor in state.items()}
            model.load_state_dict(state, assign=True)
            return model
        return load
    if variant == "hasten":
        from hasten import load_checkpoint_and_dispatch
    else:
        from accelerate import load_checkpoint_and_dispatch
    return lambda model, checkpoint, device_map, offload_folder=None, dtype=None: load_checkpoint_and_dispatch(
        model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype)


def _load(variant: str, model, checkpoint: str, device_map, offload_folder=None):
    return _loader(variant)(model, checkpoint, device_map, offload_folder)


LOAD_CASES = ("float32 warm", "bfloat16 warm", "float32 cold", "bfloat16 cold")


def child(task: str, variant: str, folder: str) -> dict:
    import gc

    import psutil
    import torch

    checkpoint = os.path.join(folder, "model.safetensors")
    model = _empty_model(variant)
    if task.startswith("load"):
        dtype = torch.bfloat16 if "bfloat16" in task else None
        load = _loader(variant)
        x = torch.load(os.path.join(folder, "input.pt")).to(dtype or torch.float32)
    gc.collect()
    before = psutil.Process().memory_info().rss
    reset_peak_rss()
    start = time.perf_counter()
    if task.startswith("load"):
        model = load(model, checkpoint, {"": "cpu"}, dtype=dtype)
        loaded = time.perf_counter()
        with torch.no_grad():  # the first forward reads every weight (a mapped one only now)
            output = model(x)
        seconds = time.perf_counter() - start
        result = {"seconds": seconds, "load_seconds": loaded - start, "probe": float(output.double().sum())}
    else:  # offload: half the blocks on disk (plain torch: fully loaded, the reference output)
        offload = os.path.join(folder, f"offload-{variant}-{os.getpid()}")
        model = _load(variant, model, checkpoint, None if variant == "torch" else half_on_disk_map(), offload)
        x = torch.load(os.path.join(folder, "input.pt"))
        forward_start = time.perf_counter()
        with torch.no_grad():
            output = model(x)
        seconds = time.perf_counter() - forward_start
        torch.save(output, os.path.join(folder, f"output-{variant}.pt"))
        shutil.rmtree(offload, ignore_errors=True)
        result = {"seconds": seconds, "load_seconds": forward_start - start}
    result["peak_growth"] = peak_rss() - before
    return result


def _evict(path: Path) -> None:
    """Drop ``path`` from the page cache, so the next read comes from the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def _warm(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(1 << 26):
            pass


def _run_child(task: str, variant: str, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    checkpoint = folder / "model.safetensors"
    if task.startswith("load"):
        _evict(checkpoint) if task.endswith("cold") else _warm(checkpoint)
    finished = subprocess.run([sys.executable, __file__, "--child", task, variant, str(folder)], env=env,
                              capture_output=True, text=True)
    if finished.returncode != 0:
        raise RuntimeError(f"{task}/{variant} failed:\n{finished.stderr[-3000:]}")
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    if task.startswith("load") and "probe" not in result:
        raise RuntimeError(f"{task}/{variant} gave no output probe: {finished.stdout[-2000:]}")
    return result


# ------------------------------------------------------------------ benchmarks
def _variants() -> list[str]:
    return ["torch", "hasten"] + (["accelerate"] if is_installed("accelerate") else [])


def bench_load(folder: Path, file_size: int, pairs: int = 30) -> list:
    variants = _variants()
    runs: dict = {(case, v): [] for case in LOAD_CASES for v in variants}
    for round_index in range(pairs):
        order = variants[round_index % len(variants):] + variants[:round_index % len(variants)]
        for case in LOAD_CASES:
            for variant in order:
                runs[case, variant].append(_run_child(f"load {case}", variant, folder))
    rows = []
    for case in LOAD_CASES:
        probes = {v: {round(r["probe"], 2) for r in runs[case, v]} for v in variants}
        assert len(set().union(*probes.values())) == 1, f"{case}: the variants computed different outputs: {probes}"
        for variant in variants:
            done = runs[case, variant]
            row = {"benchmark": f"load_checkpoint_and_dispatch + one forward, 0.8 GB safetensors, {case}",
                   "variant": variant, "median_s": statistics.median(r["seconds"] for r in done),
                   "min_s": min(r["seconds"] for r in done), "repeats": len(done),
                   "load_seconds": statistics.median(r["load_seconds"] for r in done),
                   "peak_rss_growth_x_file": statistics.median(r["peak_growth"] for r in done) / file_size}
            for other in ("torch", "accelerate"):
                if other in variants and other != variant:
                    row[f"vs_{other}"] = statistics.median(
                        mine["seconds"] / theirs["seconds"] for mine, theirs in zip(done, runs[case, other]))
            row["ratio"] = row.get("vs_torch", 1.0)  # "vs baseline": plain PyTorch, median per round
            ratios = "".join(f"; {row[k]:.2f}x {k[3:]} (median per round)" for k in ("vs_torch", "vs_accelerate")
                             if k in row)
            growth = row["peak_rss_growth_x_file"]
            row["note"] = f"load {row['load_seconds']:.3f} s; peak RSS +{growth:.2f}x file{ratios}"
            rows.append(row)
    print(format_table(rows), flush=True)
    return rows


def bench_plan() -> list:
    from collections import OrderedDict

    import torch
    import torch.nn as nn

    import hasten

    class Layer(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.act, self.drop = nn.GELU(), nn.Dropout(0.0)

    with torch.device("meta"):
        model = nn.Sequential(OrderedDict([("embed", nn.Embedding(32000, 64)),
                                           ("h", nn.Sequential(*[Layer(64) for _ in range(1100)])),
                                           ("norm", nn.LayerNorm(64)), ("head", nn.Linear(64, 32000, bias=False))]))
    model.head.weight = model.embed.weight
    modules = sum(1 for _ in model.modules())
    from hasten.big_modeling import compute_module_sizes

    total = int(compute_module_sizes(model)[""])
    budget = {0: total // 4, 1: total // 4, "cpu": total // 4}
    variants = {"hasten": lambda: hasten.infer_auto_device_map(model, max_memory=budget)}
    if is_installed("accelerate"):
        import logging

        import accelerate

        logging.getLogger("accelerate").setLevel(logging.ERROR)  # "device 0 is not available" on a CPU machine
        variants["accelerate"] = lambda: accelerate.infer_auto_device_map(model, max_memory=dict(budget))
        assert dict(variants["hasten"]()) == dict(variants["accelerate"]()), "the device maps differ"
    return compare(f"infer_auto_device_map, {modules} modules", variants, repeats=7, baseline="accelerate")


def bench_offload(folder: Path, model_size: int) -> list:
    import torch

    runs: dict[str, list] = {v: [] for v in _variants()}

    def variant(name):
        def run():
            result = _run_child("offload", name, folder)
            runs[name].append(result)
            return result["seconds"]
        return run

    rows = compare("forward with half the blocks on disk (torch: fully loaded)", {v: variant(v) for v in _variants()},
                   repeats=3, show=False)
    expected = torch.load(folder / "output-torch.pt")
    for row in rows:
        name = row["variant"]
        growth = statistics.median(r["peak_growth"] for r in runs[name])
        same = torch.equal(torch.load(folder / f"output-{name}.pt"), expected)
        row["note"] = (row["note"] + "; " if row["note"] else "") + \
            f"peak RSS +{growth / model_size:.2f}x model; output {'identical' if same else 'DIFFERENT'}"
        row["peak_rss_growth_x_model"] = growth / model_size
        row["identical_output"] = same
    print(format_table(rows), flush=True)
    return rows


def main(only=None, pairs: int = 30) -> list:
    only = set(only or ["load", "plan", "offload"])
    rows = []
    if "plan" in only:
        rows += bench_plan()
    if only & {"load", "offload"}:
        folder = Path(tempfile.mkdtemp(prefix="hasten-bench-bigmodel-"))
        try:
            checkpoint = write_checkpoint(folder)
            size = checkpoint.stat().st_size
            _warm(checkpoint)  # the offload benchmark reads from memory
            if "load" in only:
                rows += bench_load(folder, size, pairs)
            if "offload" in only:
                rows += bench_offload(folder, size)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["load", "plan", "offload"])
    parser.add_argument("--pairs", type=int, default=int(os.environ.get("BENCH_PAIRS", 30)),
                        help="rounds of the load benchmark (each runs every variant once per case)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", nargs=3, metavar=("TASK", "VARIANT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
    else:
        result = main(args.only, args.pairs)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
