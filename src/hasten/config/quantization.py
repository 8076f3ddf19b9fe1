"""``BnbQuantizationConfig``: 8-bit / 4-bit bitsandbytes quantization (planned), and ``CustomDtype``.

The config validates its options now; ``hasten.utils.load_and_quantize_model`` raises ``NotYetSupportedError``
until the bitsandbytes backend lands. bitsandbytes is never imported here.
"""
from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

import torch

__all__ = ["CustomDtype", "BnbQuantizationConfig"]


class CustomDtype(enum.Enum):
    """Data types torch has no dtype for, usable in ``infer_auto_device_map(special_dtypes=...)`` sizes."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dtype(value, what: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in _DTYPES:
        return _DTYPES[value]
    raise ValueError(f"{what} must be a torch.dtype or one of {list(_DTYPES)}, got {value!r}.")


@dataclass
class BnbQuantizationConfig:
    """Options of bitsandbytes quantization; exactly one of ``load_in_8bit`` and ``load_in_4bit`` must be True.

    llm_int8_threshold: outlier threshold of 8-bit matmuls (8-bit only).
    bnb_4bit_quant_type: "fp4" or "nf4"; bnb_4bit_use_double_quant: quantize the quantization constants too.
    bnb_4bit_compute_dtype: dtype of the 4-bit matmuls ("fp32", "fp16", "bf16" or a torch.dtype).
    torch_dtype: dtype of the layers left unquantized (default fp16 for 8-bit, the compute dtype for 4-bit).
    skip_modules: modules not quantized (kept in ``torch_dtype``); keep_in_fp32_modules: kept in float32.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: str = "fp16"
    torch_dtype: torch.dtype = None
    skip_modules: list[str] = None
    keep_in_fp32_modules: list[str] = None

    def __post_init__(self):
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"BnbQuantizationConfig.{name} must be True or False, got {getattr(self, name)!r}.")
        if self.load_in_4bit == self.load_in_8bit:
            raise ValueError("BnbQuantizationConfig needs exactly one of load_in_8bit=True and load_in_4bit=True "
                             f"(got load_in_8bit={self.load_in_8bit}, load_in_4bit={self.load_in_4bit}).")
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, (int, float)):
            raise ValueError(f"BnbQuantizationConfig.llm_int8_threshold must be a number, "
                             f"got {self.llm_int8_threshold!r}.")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(f"BnbQuantizationConfig.bnb_4bit_quant_type must be 'fp4' or 'nf4', "
                             f"got {self.bnb_4bit_quant_type!r}.")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype,
                                             "BnbQuantizationConfig.bnb_4bit_compute_dtype")
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ValueError(f"BnbQuantizationConfig.{name} must be a list of module names, got {value!r}.")
        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold only applies to 8-bit quantization; it is ignored with load_in_4bit.")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype(self.torch_dtype, "BnbQuantizationConfig.torch_dtype")
