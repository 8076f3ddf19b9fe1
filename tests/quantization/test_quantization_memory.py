"""Memory of quantized loading: ``hasten estimate-memory --dtypes int8 int4`` against what
``load_and_quantize_model`` really allocates, and the peak RSS while loading a sharded checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hasten.big_modeling import init_empty_weights
from hasten.commands import estimate
from hasten.quantization.sizes import allocated_bytes
from hasten.utils import BnbQuantizationConfig, load_and_quantize_model

bnb = pytest.importorskip("bitsandbytes")

from quantization_models import TinyLM, make_model, save_sharded  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: quantization_models.py


def test_estimate_memory_agrees_with_the_loaded_model(tmp_path, capsys):
    kwargs = {"d": 96, "layers": 3, "vocab": 128}
    save_sharded(make_model(**kwargs), tmp_path, shards=2)
    parser_args = ["estimate-memory", "quantization_models:TinyLM", "--kwargs", json.dumps(kwargs),
                   "--dtypes", "int8", "int4", "--json"]
    import argparse

    parser = argparse.ArgumentParser()
    estimate.add_parser(parser.add_subparsers(dest="command"))
    assert estimate.run(parser.parse_args(parser_args)) == 0
    rows = {row["dtype"]: row["total_size"] for row in json.loads(capsys.readouterr().out)["rows"]}
    for name, config in (("int8", BnbQuantizationConfig(load_in_8bit=True)),
                         ("int4", BnbQuantizationConfig(load_in_4bit=True))):
        with init_empty_weights():
            model = TinyLM(**kwargs)
        real = allocated_bytes(load_and_quantize_model(model, config, str(tmp_path)))
        assert abs(rows[name] - real) <= 0.10 * real, (name, rows[name], real)
    # and it is not the float16 figure: the quantized layers count for less
    assert rows["int4"] < rows["int8"] < 2 * sum(p.numel() for p in TinyLM(**kwargs).parameters())


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import torch, bitsandbytes
    from hasten.big_modeling import init_empty_weights
    from hasten.utils import BnbQuantizationConfig, load_and_quantize_model
    from quantization_models import TinyLM

    config = BnbQuantizationConfig(load_in_8bit=True)
    warm = torch.nn.Linear(64, 64)  # load bitsandbytes' CPU kernels before measuring
    bitsandbytes.nn.Int8Params(warm.weight.data, requires_grad=False, has_fp16_weights=False).to("cpu")
    with init_empty_weights():
        model = TinyLM(**{kwargs!r})
    def status(field):
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(field))

    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets the peak RSS (VmHWM) to the current RSS: the imports' peak does not count
    before = status("VmRSS:")
    model = load_and_quantize_model(model, config, {folder!r})
    print(json.dumps({{"growth": status("VmHWM:") - before}}))
""")


def test_peak_rss_while_loading_is_bounded_by_the_largest_shard(tmp_path):
    kwargs = {"d": 512, "layers": 8, "vocab": 64}
    reference = make_model(**kwargs)
    float_bytes = sum(t.numel() * t.element_size() for t in reference.state_dict().values())  # ~67 MB
    files = save_sharded(reference, tmp_path, shards=8)
    largest_shard = max(os.path.getsize(path) for path in files)
    del reference
    code = _CHILD.format(tests=TESTS, kwargs=kwargs, folder=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    growth = json.loads(result.stdout.strip().splitlines()[-1])["growth"]
    # the loaded 8-bit model is about a quarter of the float one; loading may add one shard and allocator slack
    quantized_bytes = float_bytes // 4 + 2 * 2**20
    slack = 12 * 2**20
    assert growth <= quantized_bytes + largest_shard + slack, (growth, quantized_bytes, largest_shard)
    assert growth < 0.6 * float_bytes, (growth, float_bytes)  # far from holding the float model
