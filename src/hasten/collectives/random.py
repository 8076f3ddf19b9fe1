"""Seeding every random number generator, and making processes share process 0's RNG state.

``set_seed`` seeds Python's ``random``, NumPy and torch (every device). ``synchronize_rng_state(s)`` copies
process 0's generator state to all processes with ``torch.distributed.broadcast``, so that, e.g., every
process shuffles its data loader the same way; in a single process it is a no-op.
"""
from __future__ import annotations

import importlib.util
import os
import random
from typing import Iterable, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from ..config.enums import RNGType
from ..state import PartialState

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]

_MAX_SEED = 2**32 - 1  # NumPy's limit, the smallest of the three
# Device RNGs that live under ``torch.<name>`` with get_rng_state / set_rng_state / is_available.
_DEVICE_RNGS = ("cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu", "neuron")
# Backends whose collectives take CPU tensors; others (nccl, xccl ...) need tensors on the process's device.
_CPU_BACKENDS = ("gloo", "mpi")
# cuBLAS needs a fixed workspace for deterministic results; this is the value torch's docs recommend.
_CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


def _xla_model():
    """``torch_xla.core.xla_model`` when torch_xla is installed, else None (imported only when asked)."""
    if importlib.util.find_spec("torch_xla") is None:
        return None
    import torch_xla.core.xla_model as xm

    return xm


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` (CPU and every accelerator) for reproducible runs.

    Parameters:
        seed: the seed, an int in ``[0, 2**32 - 1]``.
        device_specific: add the process index, so each process draws different numbers (e.g. for data
            augmentation) while the run as a whole stays reproducible.
        deterministic: also make torch use deterministic algorithms (``torch.use_deterministic_algorithms``,
            cuDNN deterministic, cuDNN benchmark off). Slower. cuBLAS additionally needs the environment
            variable ``CUBLAS_WORKSPACE_CONFIG``; when it is unset it is set to ``":4096:8"`` here, which only
            takes effect if no cuBLAS call was made yet in this process — set it before starting Python to be
            sure.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_seed needs an int seed, got {seed!r} ({type(seed).__name__}).")
    seed = int(seed)
    if device_specific:
        seed += PartialState().process_index
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(
            f"Seed {seed} is out of range: NumPy accepts seeds in [0, {_MAX_SEED}]"
            + (" (the process index was added because device_specific=True)." if device_specific else ".")
        )
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and every device torch knows about
    torch.cuda.manual_seed_all(seed)  # safe without CUDA: deferred until CUDA is initialised
    xm = _xla_model()
    if xm is not None:
        xm.set_rng_state(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_DETERMINISTIC_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def _parse_rng_type(rng_type) -> RNGType:
    if rng_type is None:
        raise ValueError(
            f"synchronize_rng_state needs an rng_type; choose one of {', '.join(map(repr, RNGType.list()))}."
        )
    return RNGType.parse(rng_type, "rng_type")


def _device_module(name: str):
    """``torch.cuda``/``torch.xpu``/... when that device is present here, else a clear error."""
    module = getattr(torch, name, None)
    is_available = getattr(module, "is_available", None)
    if module is None or is_available is None or not is_available():
        raise RuntimeError(
            f"Cannot synchronise the {name!r} RNG: no {name.upper()} device is available in this process. "
            "Remove it from rng_types (use 'torch' or 'generator' on this machine)."
        )
    return module


def _read_state(kind: RNGType, generator: Optional[torch.Generator]) -> torch.Tensor:
    if kind == RNGType.TORCH:
        return torch.get_rng_state()
    if kind == RNGType.GENERATOR:
        if generator is None:
            raise ValueError("rng_type 'generator' needs the torch.Generator to synchronise: pass generator=...")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        return generator.get_state()
    if kind == RNGType.XLA:
        xm = _xla_model()
        if xm is None:
            raise RuntimeError(
                "Cannot synchronise the 'xla' RNG: torch_xla is not installed (not available here). Remove 'xla' "
                "from rng_types, or run on a TPU host with torch_xla (see hasten.utils.install_xla)."
            )
        return torch.tensor([xm.get_rng_state()], dtype=torch.int64)
    return _device_module(kind.value).get_rng_state()


def _write_state(kind: RNGType, state: torch.Tensor, generator: Optional[torch.Generator]) -> None:
    if kind == RNGType.TORCH:
        torch.set_rng_state(state)
    elif kind == RNGType.GENERATOR:
        generator.set_state(state)
    elif kind == RNGType.XLA:
        _xla_model().set_rng_state(int(state.item()))
    else:
        _device_module(kind.value).set_rng_state(state)


def _broadcast_from_main(state_tensor: torch.Tensor) -> torch.Tensor:
    """Process 0's copy of ``state_tensor`` on every process (the tensor itself when alone)."""
    partial = PartialState()
    if not partial.use_distributed:
        return state_tensor
    backend = dist.get_backend()
    if backend in _CPU_BACKENDS:
        buffer = state_tensor.clone()
        dist.broadcast(buffer, src=0)
        return buffer
    buffer = state_tensor.to(partial.device)
    dist.broadcast(buffer, src=0)
    return buffer.cpu()


def synchronize_rng_state(rng_type: Optional[Union[str, RNGType]] = None,
                          generator: Optional[torch.Generator] = None) -> None:
    """Give every process the state of process 0's generator of kind ``rng_type``.

    ``rng_type`` is ``"torch"`` (the CPU generator), ``"cuda"`` (current GPU), another device name, ``"xla"``,
    or ``"generator"`` (then ``generator`` is the ``torch.Generator`` to synchronise). All processes must call
    it together. In a single process nothing changes.
    """
    kind = _parse_rng_type(rng_type)
    state = _read_state(kind, generator)
    _write_state(kind, _broadcast_from_main(state), generator)


def synchronize_rng_states(rng_types: Iterable[Union[str, RNGType]],
                           generator: Optional[torch.Generator] = None) -> None:
    """``synchronize_rng_state`` for each of ``rng_types``; every entry is checked before any is synchronised."""
    if isinstance(rng_types, (str, RNGType)):
        rng_types = [rng_types]
    kinds = [_parse_rng_type(rng_type) for rng_type in rng_types]
    states = [_read_state(kind, generator) for kind in kinds]  # reading has no side effect: fail before any change
    for kind, state in zip(kinds, states):
        _write_state(kind, _broadcast_from_main(state), generator)
