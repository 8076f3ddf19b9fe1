"""``BnbQuantizationConfig``: the options of 8-bit / 4-bit bitsandbytes quantization, and ``CustomDtype``.

The config only validates and normalises options (dtype strings become ``torch.dtype``); it never imports
bitsandbytes, so it can be built on a machine without the ``bnb`` extra. ``hasten.utils.load_and_quantize_model``
(implemented in ``hasten.quantization``) applies it to a model.
"""
from __future__ import annotations

import difflib
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


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
           "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_QUANT_TYPES = ("fp4", "nf4")


def _dtype(value, what: str) -> torch.dtype:
    if isinstance(value, str):
        value = _DTYPES.get(value.replace("torch.", ""), value)
    if value in (torch.float32, torch.float16, torch.bfloat16):
        return value
    raise ValueError(f"{what} must be one of 'fp32', 'fp16', 'bf16' (or torch.float32 / float16 / bfloat16), "
                     f"got {value!r}.")


def _module_names(value, what: str):
    if value is None:
        return None
    if isinstance(value, tuple):
        value = list(value)
    if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        raise ValueError(f"BnbQuantizationConfig.{what} must be a list of module names (e.g. ['lm_head']), "
                         f"got {value!r}.")
    return value


@dataclass
class BnbQuantizationConfig:
    """Options of bitsandbytes quantization; exactly one of ``load_in_8bit`` and ``load_in_4bit`` must be True.

    llm_int8_threshold: outlier threshold of 8-bit matmuls (8-bit only): input columns with a larger magnitude
        are multiplied in 16 bits.
    bnb_4bit_quant_type: "fp4" or "nf4"; bnb_4bit_use_double_quant: quantize the quantization constants too.
    bnb_4bit_compute_dtype: dtype of the 4-bit matmuls ("fp32", "fp16", "bf16" or a torch.dtype).
    torch_dtype: dtype of the layers left unquantized (default fp16 for 8-bit, the compute dtype for 4-bit).
    skip_modules: modules not quantized, kept in ``torch_dtype``. None (the default) means the model's output
        head and tied weights (``get_keys_to_not_convert``), chosen when the model is known.
    keep_in_fp32_modules: modules not quantized and kept in float32 (e.g. layer norms sensitive to rounding).
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
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, (int, float)) \
                or self.llm_int8_threshold < 0:
            raise ValueError(f"BnbQuantizationConfig.llm_int8_threshold must be a non-negative number, "
                             f"got {self.llm_int8_threshold!r}.")
        if self.bnb_4bit_quant_type not in _QUANT_TYPES:
            close = difflib.get_close_matches(str(self.bnb_4bit_quant_type), _QUANT_TYPES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"BnbQuantizationConfig.bnb_4bit_quant_type must be 'fp4' or 'nf4', "
                             f"got {self.bnb_4bit_quant_type!r}{hint}.")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "BnbQuantizationConfig.bnb_4bit_compute_dtype")
        self.skip_modules = _module_names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _module_names(self.keep_in_fp32_modules, "keep_in_fp32_modules")
        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold only applies to 8-bit quantization; it is ignored with load_in_4bit.")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype(self.torch_dtype, "BnbQuantizationConfig.torch_dtype")
