"""Writing ``.safetensors`` files straight from tensor memory.

``safetensors.torch.save_file`` first copies every tensor into a Python ``bytes`` object, which doubles the
memory a save needs and makes it slower than ``torch.save``. The format is simple (an 8-byte header length,
a JSON header giving each tensor's dtype, shape and byte range, then the raw little-endian bytes), so this
module writes it directly: each CPU tensor's own memory goes to the file, nothing is copied. Files are read
back with the safetensors library itself, which validates them.
"""
from __future__ import annotations

import json
import struct
import sys
from typing import Iterator, Mapping, Optional

import torch

__all__ = ["write_safetensors", "safetensors_pieces", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.complex64: "C64",
}
_HEADER_ALIGNMENT = 8


def _host_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data as a flat CPU uint8 tensor (no copy for contiguous CPU tensors)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


def _check(tensors: Mapping) -> None:
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"safetensors files need string keys, got {name!r}.")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"safetensors files hold tensors only; {name!r} is a {type(tensor).__name__}.")
        if tensor.layout != torch.strided:
            raise TypeError(f"safetensors cannot store the sparse tensor {name!r}; call .to_dense() first.")
        if tensor.device.type == "meta":
            raise ValueError(f"{name!r} is on the meta device (it has no data): load or materialise it first.")
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"safetensors cannot store {name!r} of dtype {tensor.dtype}.")


def safetensors_pieces(tensors: Mapping[str, torch.Tensor], metadata: Optional[dict] = None) -> Iterator:
    """The bytes of a safetensors file of ``tensors``, in order: the header, then each tensor's own memory.
    Bad input (a non-tensor, a sparse or meta tensor) raises here, before anything is produced."""
    _check(tensors)
    return _pieces(tensors, metadata)


def _pieces(tensors: Mapping[str, torch.Tensor], metadata: Optional[dict]) -> Iterator:
    if sys.byteorder != "little":  # the format is little-endian; let the library convert
        from safetensors.torch import save

        yield save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
        return
    # Larger elements first, as the reference writer does, so that every tensor starts at an aligned offset.
    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    header: dict = {"__metadata__": {str(k): str(v) for k, v in (metadata or {"format": "pt"}).items()}}
    offset = 0
    for name in order:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % _HEADER_ALIGNMENT)
    yield struct.pack("<Q", len(encoded)) + encoded
    for name in order:
        if tensors[name].numel():
            yield _host_bytes(tensors[name]).numpy().data


def write_safetensors(tensors: Mapping[str, torch.Tensor], path, metadata: Optional[dict] = None) -> None:
    """Write ``tensors`` to ``path`` (a path or a binary file object) in the safetensors format. Tensors that
    share memory are written twice: drop aliases first if they should be stored once."""
    pieces = safetensors_pieces(tensors, metadata)
    if hasattr(path, "write"):
        for piece in pieces:
            path.write(piece)
        return
    with open(path, "wb") as handle:
        for piece in pieces:
            handle.write(piece)
