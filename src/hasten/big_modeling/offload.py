"""Weights kept on disk: one raw ``<name>.dat`` file per tensor plus an ``index.json`` of dtypes and shapes.

The layout is Accelerate's (raw C-order bytes, bfloat16 / float8 stored as same-width integers), so an offload
folder written by either library can be read by the other. Reading maps the file (copy-on-write), so what an
offloaded layer costs in RAM is given back as soon as the layer has run.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Optional, Union

import torch

from ..core.aliases import Device
from .module_tensors import tensor_bytes_view
from .tensor_placement import set_module_tensor_to_device

__all__ = ["offload_weight", "load_offloaded_weight", "save_offload_index", "offload_state_dict",
           "load_offloaded_weights", "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict"]

INDEX_FILE = "index.json"
_NUMPY_NAMES = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
                torch.int32: "int32", torch.int64: "int64", torch.float16: "float16", torch.float32: "float32",
                torch.float64: "float64", torch.complex64: "complex64", torch.complex128: "complex128"}


def _index_dtype(dtype: torch.dtype) -> str:
    """The dtype name written in ``index.json`` (numpy's name, or the torch name numpy lacks)."""
    return _NUMPY_NAMES.get(dtype) or str(dtype).split(".")[-1]


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"The offload index names dtype {name!r}, which this version of torch does not know.")
    return dtype


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: Union[str, os.PathLike],
                   index: Optional[dict] = None) -> Optional[dict]:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat``; record its dtype and shape in ``index``."""
    tensor = weight.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    tensor = tensor.contiguous()
    path = os.path.join(offload_folder, f"{weight_name}.dat")
    with open(path, "wb") as handle:
        if tensor.numel() > 0:
            handle.write(tensor_bytes_view(tensor))
    if index is not None:
        index[weight_name] = {"dtype": _index_dtype(tensor.dtype), "shape": list(tensor.shape)}
    return index


def load_offloaded_weight(weight_file: Union[str, os.PathLike], weight_info: dict) -> torch.Tensor:
    """Read one tensor written by ``offload_weight`` (``weight_info`` is its entry of the index).

    The tensor is a copy-on-write memory map of the file: nothing is read until it is used, and its pages go
    back to the system as soon as it is dropped (a heap copy would stay with the allocator, so offloaded
    inference would grow by a layer's size at every forward).
    """
    shape = tuple(weight_info["shape"])
    dtype = _torch_dtype(weight_info["dtype"])
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    try:
        tensor = torch.from_file(os.fspath(weight_file), shared=False, size=numel, dtype=dtype)
    except RuntimeError as error:
        if "smaller" in str(error):
            raise OSError(f"{weight_file} is shorter than the {numel} elements of {dtype} its index entry describes.") from None
        raise
    return tensor.view(shape)


def save_offload_index(index: dict, offload_folder: Union[str, os.PathLike]) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (written atomically)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_FILE)
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            current = json.load(handle)
    current.update(index)
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=2)
    os.replace(temporary, path)


def offload_state_dict(save_dir: Union[str, os.PathLike], state_dict: dict[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (created if needed) and update its index."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict = {}
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta":
            raise ValueError(
                f"{name} is on the meta device: it has no data to offload. Load the weights first "
                "(load_checkpoint_in_model writes 'disk' modules to the offload folder itself)."
            )
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def load_offloaded_weights(model: torch.nn.Module, index: dict, offload_folder: Union[str, os.PathLike]) -> None:
    """Put every tensor listed in ``index`` back into ``model``, on the CPU (copied into RAM: the model must not
    depend on the folder, which may be deleted)."""
    if not index:
        return
    for name, info in index.items():
        if "SCB" in name:  # 8-bit statistics travel with their weight
            continue
        statistics = None
        scb = name.replace("weight", "SCB")
        if "weight" in name and scb in index:
            statistics = load_offloaded_weight(os.path.join(offload_folder, f"{scb}.dat"), index[scb])
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info).clone()
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)


class PrefixedDataset(Mapping):
    """A view of ``dataset`` in which key ``k`` means ``prefix + k`` (the weights of one submodule).

    Iterating gives the keys without the prefix, consistently with indexing (Accelerate's yields them
    with it, and counts the whole dataset in ``len``).
    """

    def __init__(self, dataset: Mapping, prefix: str):
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key):
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key) -> bool:
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self):
        cut = len(self.prefix)
        return iter([key[cut:] for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self):
        return sum(1 for key in self.dataset if key.startswith(self.prefix))


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping name -> tensor over weights kept in memory (``state_dict``) and/or on disk.

    Disk entries are those of ``index`` (default: ``<save_folder>/index.json``): either ``.dat`` files in
    ``save_folder`` or, when an entry has ``safetensors_file`` (and optionally ``weight_name``), one tensor of
    a safetensors checkpoint. Values are read on each access, so nothing stays in RAM between forwards.
    """

    def __init__(self, state_dict: Optional[dict[str, torch.Tensor]] = None,
                 save_folder: Optional[Union[str, os.PathLike]] = None, index: Optional[Mapping[str, dict]] = None,
                 device: Optional[Device] = None):
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index of offloaded weights.")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            path = os.path.join(save_folder, INDEX_FILE)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{save_folder} has no {INDEX_FILE}: it is not an offload folder (write one with offload_state_dict)."
                )
            with open(path, encoding="utf-8") as handle:
                index = json.load(handle)
        self.index = {} if index is None else index
        self.all_keys = list(self.state_dict) + [key for key in self.index if key not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            return self._from_safetensors(key, info)
        return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)

    def _from_safetensors(self, key: str, info: dict) -> torch.Tensor:
        from safetensors import safe_open

        device = "cpu" if self.device is None else self.device
        with safe_open(info["safetensors_file"], framework="pt", device="cpu") as handle:
            tensor = handle.get_tensor(info.get("weight_name", key))
        if "dtype" in info:
            tensor = tensor.to(_torch_dtype(info["dtype"]))
        return tensor.to(device) if tensor.device != torch.device(device) else tensor

    def __contains__(self, key) -> bool:
        return key in self.state_dict or key in self.index

    def __iter__(self):
        return iter(self.all_keys)

    def __len__(self):
        return len(self.all_keys)


def extract_submodules_state_dict(state_dict: dict[str, torch.Tensor], submodule_names: list[str]) -> dict:
    """The entries of ``state_dict`` that belong to the given submodules (``h.1`` takes ``h.1.*``, not ``h.10.*``)."""
    wanted = set(submodule_names)
    result = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if "" in wanted or any(".".join(parts[:end]) in wanted for end in range(1, len(parts) + 1)):
            result[key] = value
    return result
