"""``BnbQuantizationConfig``: SPEC §3 defaults, normalisation and the errors for bad options; the missing extra."""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from hasten.utils import BnbQuantizationConfig, CustomDtype, load_and_quantize_model


def test_fields_and_defaults_follow_the_spec():
    fields = {f.name: f.default for f in dataclasses.fields(BnbQuantizationConfig)}
    assert fields == {"load_in_8bit": False, "llm_int8_threshold": 6.0, "load_in_4bit": False,
                      "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False,
                      "bnb_4bit_compute_dtype": "fp16", "torch_dtype": None, "skip_modules": None,
                      "keep_in_fp32_modules": None}


def test_dtypes_are_normalised_with_the_advised_defaults():
    eight = BnbQuantizationConfig(load_in_8bit=True)
    assert eight.torch_dtype == torch.float16 and eight.target_dtype == torch.int8
    four = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert four.bnb_4bit_compute_dtype == torch.bfloat16 and four.torch_dtype == torch.bfloat16
    assert four.target_dtype == CustomDtype.INT4
    assert BnbQuantizationConfig(load_in_4bit=True).bnb_4bit_compute_dtype == torch.float16
    for spelled in ("fp32", "float32", "torch.float32", torch.float32):
        config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype=spelled, torch_dtype=spelled)
        assert config.bnb_4bit_compute_dtype == torch.float32 and config.torch_dtype == torch.float32
    config = BnbQuantizationConfig(load_in_8bit=True, skip_modules=("head",), keep_in_fp32_modules=["norm"])
    assert config.skip_modules == ["head"] and config.keep_in_fp32_modules == ["norm"]


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of load_in_8bit=True and load_in_4bit=True"),
    ({"load_in_8bit": True, "load_in_4bit": True}, "exactly one of"),
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "np4"}, r"got 'np4' \(did you mean nf4\?\)"),
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "int3"}, "must be 'fp4' or 'nf4', got 'int3'.$"),
    ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"}, "bnb_4bit_compute_dtype must be one of"),
    ({"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.int8}, "bnb_4bit_compute_dtype must be one of"),
    ({"load_in_8bit": True, "torch_dtype": "int8"}, "torch_dtype must be one of"),
    ({"load_in_8bit": True, "llm_int8_threshold": "6"}, "llm_int8_threshold must be a non-negative number"),
    ({"load_in_8bit": True, "llm_int8_threshold": -1.0}, "llm_int8_threshold must be a non-negative number"),
    ({"load_in_8bit": 1}, "load_in_8bit must be True or False"),
    ({"load_in_8bit": True, "skip_modules": "head"}, "skip_modules must be a list"),
    ({"load_in_8bit": True, "keep_in_fp32_modules": [3]}, "keep_in_fp32_modules must be a list"),
])
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BnbQuantizationConfig(**kwargs)


def test_threshold_with_4bit_warns_that_it_is_ignored():
    with pytest.warns(UserWarning, match="only applies to 8-bit"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=3.0)


def test_missing_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # makes `import bitsandbytes` fail
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ImportError, match=r"pip install 'hasten\[bnb\]'"):
        load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True), "weights.safetensors")
