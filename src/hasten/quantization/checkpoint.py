"""What a checkpoint holds for a model about to be quantized: its keys and shapes, checked before any weight is read.

A key of a quantized layer is either its float weight (quantized while loading) or part of bitsandbytes'
serialisation of an already-quantized layer: an int8 ``weight`` with ``SCB`` (and ``weight_format``) for
8-bit, a packed ``weight`` with ``weight.absmax``, ``weight.quant_map`` ... for 4-bit.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Optional, Union

import torch
import torch.nn as nn

from ..big_modeling.checkpoint_files import SafetensorsFile, TorchFile, open_checkpoint, resolve_checkpoint_files

if TYPE_CHECKING:
    from ..config.quantization import BnbQuantizationConfig

__all__ = ["CheckpointPlan", "plan_checkpoint", "split_layer_key"]

logger = logging.getLogger(__name__)


def _header(reader) -> dict:
    """name -> (shape, dtype) for one opened checkpoint file, without reading any tensor data."""
    if isinstance(reader, SafetensorsFile):
        reader.check_format()
        return {name: (tuple(info["shape"]), reader.dtype_of(name)) for name, info in reader.entries.items()}
    state = reader._load()  # memory-mapped: shapes only, no data read
    header = {name: (tuple(t.shape), t.dtype) for name, t in state.items() if isinstance(t, torch.Tensor)}
    reader.close()
    return header


def split_layer_key(key: str, layers: Collection[str]) -> tuple[Optional[str], str]:
    """``(layer, rest)`` when ``key`` belongs to one of the quantized ``layers`` (``rest``: ``"weight"``, ``"SCB"``,
    ``"weight.absmax"`` ...), else ``(None, key)``."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        layer = ".".join(parts[:end])
        if layer in layers:
            return layer, ".".join(parts[end:])
    return None, key


class CheckpointPlan:
    """The files of a checkpoint, opened (headers only), and which of their keys the model takes."""

    def __init__(self, files: list[str], readers: list[Union[SafetensorsFile, TorchFile]],
                 headers: list[dict[str, tuple[tuple[int, ...], torch.dtype]]], prequantized: set[str],
                 wanted: list[list[str]]):
        self.files, self.readers, self.headers = files, readers, headers
        self.prequantized = prequantized  # quantized layers whose checkpoint is already quantized
        self.wanted = wanted  # per file, the keys to read


def plan_checkpoint(weights_location: Union[str, os.PathLike], model: nn.Module, layers: set[str],
                    config: BnbQuantizationConfig) -> CheckpointPlan:
    """Open ``weights_location`` and check it against ``model`` (whose quantized ``layers`` are bitsandbytes layers
    on the meta device). Raises ValueError naming the first key whose shape differs (both shapes shown), or the
    parameters the checkpoint lacks; keys the model does not know are logged and ignored."""
    files = resolve_checkpoint_files(weights_location)
    readers = [open_checkpoint(path) for path in files]
    headers = [_header(reader) for reader in readers]
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    found = {name: entry for header in headers for name, entry in header.items()}
    prequantized = {layer for layer in layers if f"{layer}.weight" in found and not found[f"{layer}.weight"][1].is_floating_point}
    where = os.fspath(weights_location)
    for layer in prequantized:
        _check_prequantized(layer, found, expected[f"{layer}.weight"], config, where)
    unexpected = []
    for name in found:
        layer, rest = split_layer_key(name, layers)
        if name not in expected and not (layer in prequantized or (layer is not None and rest in ("SCB", "weight_format"))):
            unexpected.append(name)
    for name in expected:  # in model order, so the first mismatch named is the first in the model
        if name not in found:
            continue
        shape = found[name][0]
        layer, rest = split_layer_key(name, layers)
        if layer in prequantized and rest == "weight":
            continue  # checked above: packed shapes differ from the float ones
        if shape != expected[name]:
            raise ValueError(f"The weights at {where} do not match {type(model).__name__}: {name!r} has shape "
                             f"{list(shape)} in the checkpoint and {list(expected[name])} in the model. Build the "
                             "model with the configuration the checkpoint was saved from.")
    parameters = {name for name, _ in model.named_parameters()}
    missing = sorted(name for name in expected if name not in found and name in parameters)
    if missing:
        raise ValueError(f"The weights at {where} have no value for {len(missing)} parameter(s) of "
                         f"{type(model).__name__}, e.g. {missing[:5]}: a quantized model cannot keep empty weights. "
                         "Check that the checkpoint belongs to this model.")
    if unexpected:
        logger.warning("The weights at %s hold keys %s does not use: %s.", where, type(model).__name__, sorted(unexpected)[:20])
    wanted = [[name for name in header if name in expected or split_layer_key(name, layers)[0] in prequantized]
              for header in headers]
    return CheckpointPlan(files, readers, headers, prequantized, wanted)


def _check_prequantized(layer, found, float_shape, config, where) -> None:
    shape, dtype = found[f"{layer}.weight"]
    if config.load_in_8bit:
        if dtype != torch.int8 or f"{layer}.SCB" not in found:
            raise ValueError(f"{layer}.weight in {where} is stored as {dtype} without 8-bit scales ({layer}.SCB): it is "
                             "not an 8-bit bitsandbytes checkpoint. Load it with load_in_4bit=True if it is 4-bit.")
        if shape != float_shape:
            raise ValueError(f"The weights at {where} do not match the model: {layer + '.weight'!r} has shape "
                             f"{list(shape)} in the checkpoint and {list(float_shape)} in the model.")
        return
    if not any(name.startswith(f"{layer}.weight.quant_state.") for name in found):
        raise ValueError(f"{layer}.weight in {where} is stored as {dtype} without a 4-bit quantization state "
                         f"({layer}.weight.quant_state.*): it is not a 4-bit bitsandbytes checkpoint. Load it with "
                         "load_in_8bit=True if it is 8-bit.")
    packed_elements = math.prod(shape) * torch.empty((), dtype=dtype).element_size() * 2
    if packed_elements < math.prod(float_shape):
        raise ValueError(f"The weights at {where} do not match the model: {layer + '.weight'!r} packs "
                         f"{packed_elements} 4-bit values (shape {list(shape)}, {dtype}) for a weight of shape "
                         f"{list(float_shape)} in the model.")
