"""bitsandbytes quantized loading, side by side: by hand, hasten and Accelerate (where it runs).

    python bench/bench_quantization.py            # 8-bit and 4-bit (~0.2 GB written to a temp folder)
    python bench/bench_quantization.py --only 8bit

For each bit width, the same sharded safetensors checkpoint (4 shards) of a 50M-parameter model is loaded on the
CPU and quantized:

* ``by hand`` (the baseline): build the float model, ``load_state_dict`` the whole checkpoint, then swap every
  Linear but the head for a bitsandbytes layer and quantize it (``Int8Params`` / ``Params4bit`` ``.to("cpu")``);
* ``hasten``: ``load_and_quantize_model`` of a model built under ``init_empty_weights``;
* ``accelerate``: its ``load_and_quantize_model`` (it refuses to run without a GPU: reported as not available).

Reported: load + quantize time (median of 3, each in a fresh process), the peak RSS the load adds to the
process, and the bytes the loaded model holds, beside the float32 model's. The variants' outputs are checked
to be identical.
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
sys.path.insert(0, str(ROOT / "tests"))
from harness import compare, current_rss, format_table, is_installed, peak_rss, reset_peak_rss  # noqa: E402
from quantization_models import TinyLM, make_model, save_sharded  # noqa: E402  (the tests' model, larger)

WIDTH, BLOCKS, VOCAB, SHARDS = 1024, 6, 1024, 4  # 6 blocks x (1024->4096->1024): ~51M float32 parameters
MODEL = dict(vocab=VOCAB, d=WIDTH, layers=BLOCKS)


def write_checkpoint(folder: Path) -> int:
    import torch

    model = make_model(seed=0, **MODEL)
    save_sharded(model, folder, SHARDS)
    torch.save(torch.randint(0, VOCAB, (2, 16)), folder / "input.pt")
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _by_hand(bits: int, folder: str):
    import bitsandbytes as bnb
    import torch
    from safetensors.torch import load_file

    model = TinyLM(**MODEL)
    for path in sorted(Path(folder).glob("*.safetensors")):
        model.load_state_dict(load_file(str(path)), strict=False)
    for block in model.blocks:
        for name in ("up", "down"):
            linear = getattr(block, name)
            if bits == 8:
                layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, has_fp16_weights=False,
                                            device="meta")
                layer.weight = bnb.nn.Int8Params(linear.weight.data.half(), requires_grad=False,
                                                 has_fp16_weights=False).to("cpu")
            else:
                layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, compute_dtype=torch.float16,
                                          compress_statistics=False, quant_type="fp4", device="meta")
                layer.weight = bnb.nn.Params4bit(linear.weight.data.half(), requires_grad=False,
                                                 compress_statistics=False, quant_type="fp4", module=layer).to("cpu")
            layer.bias = torch.nn.Parameter(linear.bias.data.half(), requires_grad=False)
            setattr(block, name, layer)
    return model.half()  # the rest in float16, as the libraries' torch_dtype default


def _library(variant: str, bits: int, folder: str):
    if variant == "hasten":
        from hasten import init_empty_weights
        from hasten.utils import BnbQuantizationConfig, load_and_quantize_model
    else:
        from accelerate import init_empty_weights
        from accelerate.utils import BnbQuantizationConfig, load_and_quantize_model
    config = BnbQuantizationConfig(load_in_8bit=bits == 8, load_in_4bit=bits == 4)
    with init_empty_weights():
        model = TinyLM(**MODEL)
    return load_and_quantize_model(model, config, weights_location=folder, device_map={"": "cpu"})


def child(variant: str, bits: str, folder: str) -> dict:
    import torch

    bits = int(bits)
    import bitsandbytes  # noqa: F401  (imported before measuring, by every variant)
    import safetensors.torch  # noqa: F401

    if variant == "hasten":  # the library's imports are not part of the load
        import hasten.utils  # noqa: F401
        from hasten.quantization import load  # noqa: F401
    elif variant == "accelerate":
        import accelerate.utils  # noqa: F401

    reset_peak_rss()
    before = current_rss()
    start = time.perf_counter()
    model = _by_hand(bits, folder) if variant == "by hand" else _library(variant, bits, folder)
    seconds = time.perf_counter() - start
    growth = peak_rss() - before
    model.eval()
    with torch.no_grad():
        output = model(torch.load(os.path.join(folder, "input.pt"))).float()
    torch.save(output, os.path.join(folder, f"output-{variant.replace(' ', '_')}-{bits}.pt"))
    from hasten.quantization.sizes import allocated_bytes

    return {"seconds": seconds, "peak_growth": growth, "model_bytes": allocated_bytes(model)}


def _run_child(variant: str, bits: int, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    finished = subprocess.run([sys.executable, __file__, "--child", variant, str(bits), str(folder)], env=env,
                              capture_output=True, text=True)
    if finished.returncode != 0:
        raise RuntimeError(f"{variant} {bits}-bit failed:\n{finished.stderr[-3000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def _accelerate_runs(folder: Path, bits: int) -> str | None:
    """None when Accelerate's load_and_quantize_model runs here, else why not."""
    if not is_installed("accelerate"):
        return "accelerate not installed"
    try:
        _run_child("accelerate", bits, folder)
    except RuntimeError as error:
        text = str(error)
        start = max(text.rfind("Error:"), text.rfind("Exception:"))
        return " ".join(text[start:].split())[:160] if start >= 0 else text.strip().splitlines()[-1][:160]
    return None


def bench_bits(folder: Path, bits: int, float_bytes: int) -> list:
    runs: dict[str, list] = {}
    refused = _accelerate_runs(folder, bits)

    def variant(name):
        def run():
            result = _run_child(name, bits, folder)
            runs.setdefault(name, []).append(result)
            return result["seconds"]
        return run

    variants = {"by hand": variant("by hand"), "hasten": variant("hasten"),
                "accelerate": None if refused else variant("accelerate")}
    rows = compare(f"load + quantize {bits}-bit, 4 shards (~{float_bytes / 2**20:.0f} MiB fp32) -> CPU", variants,
                   repeats=3, warmup=0, baseline="by hand", show=False)
    import torch

    outputs = {name: torch.load(folder / f"output-{name.replace(' ', '_')}-{bits}.pt") for name in runs}
    for name, output in outputs.items():
        assert torch.equal(output, outputs["hasten"]), f"{name} and hasten give different outputs ({bits}-bit)"
    for row in rows:
        done = runs.get(row["variant"])
        if not done:
            row["note"] = f"not available: {refused}"
            continue
        growth = statistics.median(r["peak_growth"] for r in done)
        size = done[-1]["model_bytes"]
        row["note"] = (row["note"] + "; " if row["note"] else "") + (
            f"model {size / 2**20:.1f} MiB ({size / float_bytes:.2f}x fp32), peak RSS +{growth / 2**20:.0f} MiB")
        row["model_bytes"], row["peak_growth"] = size, growth
    print(format_table(rows), flush=True)
    return rows


def main(only=None) -> list:
    only = [int(b.rstrip("bit")) for b in (only or ["8bit", "4bit"])]
    folder = Path(tempfile.mkdtemp(prefix="hasten-bench-quant-"))
    try:
        float_bytes = write_checkpoint(folder)
        print(f"float32 model: {float_bytes / 2**20:.1f} MiB", flush=True)
        rows = []
        for bits in only:
            rows += bench_bits(folder, bits, float_bytes)
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["8bit", "4bit"])
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "BITS", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
    else:
        main(args.only)
