"""``load_and_quantize_model`` on the CPU: accuracy per quant type and compute dtype, what stays unquantized,
device maps with disk offload, already-quantized checkpoints, the Accelerator, and every bad input.

Tolerances (max |quantized - float| over the logits, relative to max |float logits|), measured on
``tests/quantization_models.TinyLM``: 8-bit stays under 1% (about 0.2% measured), 4-bit fp4 / nf4 under 10%
(about 5% measured).
"""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch
import torch.nn as nn

from hasten import Accelerator
from hasten.big_modeling import init_empty_weights
from hasten.state import AcceleratorState
from hasten.utils import BnbQuantizationConfig, load_and_quantize_model
from hasten.utils.bnb import get_keys_to_not_convert, get_quantized_model_device_map, replace_with_bnb_layers

bnb = pytest.importorskip("bitsandbytes")  # the `bnb` extra; `make test` installs it

from quantization_models import TinyLM, make_model, save_sharded  # noqa: E402

IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
TOLERANCE = {"8bit": 0.01, "4bit": 0.10}


@pytest.fixture(scope="module")
def reference():
    return make_model()


@pytest.fixture(scope="module")
def sharded(reference, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    save_sharded(reference, folder, shards=3)
    return str(folder)


def _empty():
    with init_empty_weights():
        return TinyLM().eval()


def _relative_error(model, reference) -> float:
    with torch.no_grad():
        expected = reference(IDS)
        return ((model(IDS).float() - expected).abs().max() / expected.abs().max()).item()


CONFIGS = [
    ("8bit", dict(load_in_8bit=True)),
    ("8bit", dict(load_in_8bit=True, torch_dtype=torch.float32)),
    ("4bit", dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="fp32")),
    ("4bit", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp16")),
    ("4bit", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bf16",
                  bnb_4bit_use_double_quant=True)),
]


@pytest.mark.parametrize("kind, kwargs", CONFIGS, ids=[str(sorted(k.items())) for _, k in CONFIGS])
def test_each_quant_type_and_compute_dtype_stays_close_to_the_float_model(kind, kwargs, reference, sharded):
    config = BnbQuantizationConfig(**kwargs)
    model = load_and_quantize_model(_empty(), config, sharded)
    layer_class, weight_dtype = ((bnb.nn.Linear8bitLt, torch.int8) if kind == "8bit" else (bnb.nn.Linear4bit, torch.uint8))
    for block in model.blocks:
        for linear in (block.up, block.down):
            assert type(linear) is layer_class and linear.weight.dtype == weight_dtype
            assert linear.bias.dtype == config.torch_dtype
        assert block.norm.weight.dtype == config.torch_dtype
    if kind == "4bit":
        state = model.blocks[0].up.weight.quant_state
        assert state.quant_type == kwargs["bnb_4bit_quant_type"] and state.nested == config.bnb_4bit_use_double_quant
        assert model.blocks[0].up.compute_dtype == config.bnb_4bit_compute_dtype
    # the default skip_modules: the output head stays a float Linear
    assert type(model.head) is nn.Linear and model.head.weight.dtype == config.torch_dtype
    error = _relative_error(model, reference)
    assert 0 < error < TOLERANCE[kind], error  # quantized for real (not exact), yet close


def test_skip_and_keep_modules_stay_unquantized(reference, sharded):
    config = BnbQuantizationConfig(load_in_8bit=True, skip_modules=["head", "blocks.1.up"],
                                   keep_in_fp32_modules=["down", "norm"])
    model = load_and_quantize_model(_empty(), config, sharded)
    assert type(model.blocks[0].up) is bnb.nn.Linear8bitLt
    assert type(model.blocks[1].up) is nn.Linear and model.blocks[1].up.weight.dtype == torch.float16
    for block in model.blocks:
        assert type(block.down) is nn.Linear and block.down.weight.dtype == torch.float32
        assert block.norm.weight.dtype == torch.float32
    assert type(model.head) is nn.Linear and model.head.weight.dtype == torch.float16
    assert model.embed.weight.dtype == torch.float16
    assert torch.equal(model.blocks[0].down.weight, reference.blocks[0].down.weight)  # fp32 kept exactly
    assert torch.equal(model.blocks[1].up.weight, reference.blocks[1].up.weight.half())
    # (no forward here: a float32 module fed float16 activations needs a model that casts its inputs, as T5 does)


def test_default_skip_modules_are_the_head_and_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(8, 4)
            self.body = nn.Linear(4, 4)
            self.out = nn.Linear(4, 8, bias=False)
            self.out.weight = self.embed.weight

    assert get_keys_to_not_convert(Tied()) == ["embed", "out"]  # both names of the tied weight
    assert get_keys_to_not_convert(TinyLM()) == ["head"]
    assert get_keys_to_not_convert(nn.Linear(2, 2)) == []  # no children: nothing to keep


def test_device_map_auto_plans_quantized_sizes_and_offloads_8bit_layers_with_their_scales(reference, sharded, tmp_path):
    config = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
    in_memory = load_and_quantize_model(_empty(), config, sharded)
    # budget: the embedding fits on the CPU, the blocks do not
    planned = get_quantized_model_device_map(_empty(), config, "auto", max_memory={"cpu": 60_000})
    float_plan = get_quantized_model_device_map(_empty(), config, "auto", max_memory={"cpu": 200_000})
    assert "disk" in planned.values() and set(float_plan.values()) == {"cpu"}  # 200 kB: fp32 would need ~270 kB
    folder = tmp_path / "offload"
    model = load_and_quantize_model(_empty(), config, sharded, device_map="auto", max_memory={"cpu": 60_000},
                                    offload_folder=str(folder))
    assert model.hf_device_map == planned
    index = json.loads((folder / "index.json").read_text())
    assert index["blocks.1.up.weight"]["dtype"] == "int8" and index["blocks.1.up.SCB"]["dtype"] == "float32"
    assert model.blocks[1].up.weight.device.type == "meta" and model.blocks[1].up.weight.dtype == torch.int8
    first = model(IDS)
    assert torch.equal(first, in_memory(IDS)) and torch.equal(model(IDS), first)  # same as in memory, every time
    # nothing of an offloaded layer stays in memory between forwards
    assert model.blocks[1].up.weight.device.type == "meta" and model.blocks[1].up.state.CB is None


def test_4bit_layers_are_not_offloaded(sharded, tmp_path):
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="fp32")
    model = _empty()
    with pytest.raises(ValueError, match="offloads 8-bit layers only"):
        load_and_quantize_model(model, config, sharded, device_map={"embed": "cpu", "blocks": "disk", "head": "cpu"},
                                offload_folder=str(tmp_path))
    assert type(model.blocks[0].up) is nn.Linear  # refused before anything changed


@pytest.mark.parametrize("kwargs", [dict(load_in_8bit=True, torch_dtype=torch.float32),
                                    dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32"),
                                    dict(load_in_4bit=True, bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="fp32")])
def test_a_saved_quantized_model_loads_without_quantizing_twice(kwargs, sharded, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    config = BnbQuantizationConfig(**kwargs)
    model = load_and_quantize_model(_empty(), config, sharded)
    state = model.state_dict()
    path = tmp_path / "quantized.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))

    def never(*args, **kwargs):
        raise AssertionError("quantized again")

    monkeypatch.setattr(bnb.nn.Int8Params, "_quantize", never)  # weights only (8-bit matmuls quantize inputs too)
    monkeypatch.setattr(bnb.nn.Params4bit, "_quantize", never)
    again = load_and_quantize_model(_empty(), config, str(path))
    assert torch.equal(again(IDS), model(IDS))
    for key, value in again.state_dict().items():
        assert torch.equal(value, state[key]), key
    if config.load_in_8bit:  # an 8-bit checkpoint also offloads as it is
        offloaded = load_and_quantize_model(_empty(), config, str(path), offload_folder=str(tmp_path / "off"),
                                            device_map={"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk",
                                                        "head": "cpu"})
        assert torch.equal(offloaded(IDS), model(IDS))


def test_a_bin_checkpoint_and_an_in_memory_model(reference, tmp_path):
    config = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    from_bin = load_and_quantize_model(_empty(), config, str(tmp_path))
    loaded = make_model()
    in_place = load_and_quantize_model(loaded, config)  # already holds its weights: quantized where it is
    assert type(in_place.blocks[0].up) is bnb.nn.Linear8bitLt
    assert torch.equal(in_place(IDS), from_bin(IDS))


def test_prepared_by_the_accelerator_for_inference(reference, sharded, tmp_path):
    for kwargs, device_map, precision in [(dict(load_in_8bit=True), None, "no"),
                                          (dict(load_in_4bit=True, bnb_4bit_compute_dtype="bf16"), None, "no"),
                                          (dict(load_in_4bit=True, bnb_4bit_compute_dtype="bf16"), None, "bf16"),
                                          (dict(load_in_8bit=True, torch_dtype=torch.float32), "auto", "no")]:
        config = BnbQuantizationConfig(**kwargs)
        model = load_and_quantize_model(_empty(), config, sharded, device_map=device_map,
                                        max_memory={"cpu": 60_000} if device_map else None,
                                        offload_folder=str(tmp_path / "off") if device_map else None)
        with torch.no_grad():  # bitsandbytes' CPU 4-bit matmul takes another kernel without autograd
            expected = model(IDS)
        AcceleratorState._reset_state(True)
        accelerator = Accelerator(cpu=True, mixed_precision=precision)
        prepared = accelerator.prepare(model)
        with torch.no_grad():
            output = prepared(IDS).float()
        if precision == "no":
            assert torch.equal(output, expected.float())
        else:  # autocast rounds some activations differently
            assert ((output - expected.float()).abs().max() / expected.float().abs().max()).item() < 0.02
        layer = prepared.blocks[0].up
        assert isinstance(layer, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))
        assert layer.weight.dtype in (torch.int8, torch.uint8)
    AcceleratorState._reset_state(True)


# ----------------------------------------------------------------------------- bad input
def test_a_model_not_on_meta_with_weights_location_is_refused(sharded):
    with pytest.raises(ValueError, match="init_empty_weights"):
        load_and_quantize_model(make_model(), BnbQuantizationConfig(load_in_8bit=True), sharded)


def test_a_meta_model_without_weights_is_refused():
    with pytest.raises(ValueError, match="no weights_location"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True))


def test_skip_modules_naming_nothing_lists_the_modules(sharded):
    config = BnbQuantizationConfig(load_in_8bit=True, skip_modules=["lm_head"])
    with pytest.raises(ValueError, match=r"skip_modules names \['lm_head'\].*Its modules are: embed, blocks, "):
        load_and_quantize_model(_empty(), config, sharded)
    with pytest.raises(ValueError, match=r"keep_in_fp32_modules names \['ln'\]"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True, keep_in_fp32_modules=["ln"]),
                                sharded)


def test_weights_of_another_model_name_the_first_mismatch(sharded, tmp_path):
    other = tmp_path / "other"
    save_sharded(make_model(d=32), other, shards=2)
    model = _empty()
    with pytest.raises(ValueError, match=r"'embed.weight' has shape \[64, 32\] in the checkpoint and \[64, 64\] "
                                         r"in the model"):
        load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True), str(other))
    assert type(model.blocks[0].up) is nn.Linear  # nothing replaced
    partial = tmp_path / "partial"
    save_sharded(make_model(layers=1), partial, shards=1)
    with pytest.raises(ValueError, match=r"no value for 6 parameter\(s\).*blocks.1.down.bias"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), str(partial))


def test_a_checkpoint_quantized_the_other_way_is_refused(sharded, tmp_path):
    from safetensors.torch import save_file

    eight = load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), sharded)
    save_file({k: v.contiguous() for k, v in eight.state_dict().items()}, str(tmp_path / "q.safetensors"))
    with pytest.raises(ValueError, match="not a 4-bit bitsandbytes checkpoint"):
        load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_4bit=True), str(tmp_path / "q.safetensors"))


def test_device_map_errors(sharded, tmp_path):
    config = BnbQuantizationConfig(load_in_8bit=True)
    with pytest.raises(ValueError, match="pass an offload_folder"):
        load_and_quantize_model(_empty(), config, sharded, device_map={"": "disk"})
    with pytest.raises(ValueError, match="not a strategy"):
        load_and_quantize_model(_empty(), config, sharded, device_map="everywhere")
    with pytest.raises(ValueError, match="gives no device"), pytest.warns(UserWarning, match="do not match"):
        load_and_quantize_model(_empty(), config, sharded, device_map={"trunk": "cpu"})
    with pytest.raises(ValueError, match="quantized where it is"):
        load_and_quantize_model(make_model(), config, device_map={"": "cpu"})
    with pytest.raises(TypeError, match="must be a BnbQuantizationConfig"):
        load_and_quantize_model(_empty(), {"load_in_8bit": True}, sharded)


def test_unknown_checkpoint_keys_are_logged_and_ignored(reference, tmp_path, caplog):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        model = load_and_quantize_model(_empty(), BnbQuantizationConfig(load_in_8bit=True), str(tmp_path))
    assert "extra.weight" in caplog.text and type(model.blocks[0].up) is bnb.nn.Linear8bitLt
    assert not os.path.exists(tmp_path / "index.json")


def test_replace_with_bnb_layers_keeps_the_names():
    model = replace_with_bnb_layers(_empty(), BnbQuantizationConfig(load_in_4bit=True))
    assert type(model.blocks[0].up) is bnb.nn.Linear4bit and type(model.head) is nn.Linear
    assert set(model.state_dict()) == set(TinyLM().state_dict())
