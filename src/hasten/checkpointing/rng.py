"""The random generators of one process, captured for a checkpoint and put back on load.

A resumed run draws the same random numbers as the uninterrupted one only if every generator continues
where it was: Python's ``random``, NumPy's global generator, torch's CPU generator and each accelerator's
generators (all devices). The prepared data loaders' own generators travel with the loaders' states.

The dictionary uses the reference library's keys (``random_state``, ``numpy_random_seed``,
``torch_manual_seed``, ``torch_cuda_manual_seed`` ...) and only plain types, tensors and NumPy arrays, so
``random_states_{rank}.pkl`` loads with ``weights_only=True`` in either library.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import random

import numpy as np
import torch

__all__ = ["capture_rng_states", "restore_rng_states"]

logger = logging.getLogger(__name__)

# Accelerator RNGs: torch module name -> key in the saved dictionary.
_DEVICE_KEYS = {name: f"torch_{name}_manual_seed" for name in ("cuda", "xpu", "mlu", "sdaa", "musa", "hpu", "neuron")}
_XLA_KEY = "xm_seed"


def _available_device_modules():
    for name, key in _DEVICE_KEYS.items():
        module = getattr(torch, name, None)
        is_available = getattr(module, "is_available", None)
        if module is not None and is_available is not None and hasattr(module, "get_rng_state_all") and is_available():
            yield name, key, module


@functools.lru_cache(maxsize=None)
def _has_torch_xla() -> bool:
    """Whether torch_xla is installed (looked up once: every save captures the random states)."""
    return importlib.util.find_spec("torch_xla") is not None


def _xla_model():
    if not _has_torch_xla():
        return None
    import torch_xla.core.xla_model as xm

    return xm


def capture_rng_states(step: int = 0) -> dict:
    """This process's generator states, and the gradient-accumulation ``step`` (saved alongside, as the
    reference does)."""
    states = {
        "step": int(step),
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    for _, key, module in _available_device_modules():
        states[key] = module.get_rng_state_all()
    xm = _xla_model()
    if xm is not None:
        states[_XLA_KEY] = xm.get_rng_state()
    return states


def restore_rng_states(states: dict, source: str = "the checkpoint") -> None:
    """Put every generator found in ``states`` back; a device generator saved but absent here (or present here
    but not saved) is reported in the log, since the resumed run's random numbers on it will then differ."""
    missing = [key for key in ("random_state", "numpy_random_seed", "torch_manual_seed") if key not in states]
    if missing:
        raise ValueError(f"{source} holds no {', '.join(missing)}: it is not a saved random state.")
    random.setstate(_as_python_state(states["random_state"]))
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    restored = set()
    for name, key, module in _available_device_modules():
        if key in states:
            module.set_rng_state_all(states[key])
            restored.add(key)
        else:
            logger.warning("%s has no %s random state: that generator starts from its current state.", source, name)
    xm = _xla_model()
    if xm is not None and _XLA_KEY in states:
        xm.set_rng_state(states[_XLA_KEY])
        restored.add(_XLA_KEY)
    skipped = sorted(set(states) & (set(_DEVICE_KEYS.values()) | {_XLA_KEY}) - restored)
    if skipped:
        logger.warning("%s holds random states for devices not present here (%s); they were not restored.",
                       source, ", ".join(skipped))


def _as_python_state(value):
    """``random.setstate`` wants tuples; a state that went through another serializer may come back as lists."""
    if isinstance(value, list):
        return tuple(_as_python_state(item) for item in value)
    return value
