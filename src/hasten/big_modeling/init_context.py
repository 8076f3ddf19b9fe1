"""Build a model without allocating its weights: every parameter created inside the context lands on a device
of your choice (``meta`` for ``init_empty_weights``), so a 100-billion-parameter model is built in seconds."""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Optional, Union

import torch
import torch.nn as nn

from ..core.env_aliases import get_flag_setting

__all__ = ["init_empty_weights", "init_on_device"]


def _include_buffers_default() -> bool:
    """``HASTEN_INIT_INCLUDE_BUFFERS`` (or Accelerate's ``ACCELERATE_INIT_INCLUDE_BUFFERS``); off when unset."""
    return get_flag_setting("init_include_buffers")


@contextlib.contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Create models with all parameters (and, with ``include_buffers``, buffers) on the meta device.

    The model has shapes and dtypes but no data: plan it with ``infer_auto_device_map`` and fill it with
    ``load_checkpoint_and_dispatch``. Parameters tied while the model is built stay tied.

    >>> with init_empty_weights():
    ...     model = nn.Sequential(*[nn.Linear(10_000, 10_000) for _ in range(1000)])  # 400 GB, no RAM used
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as context:
        yield context


@contextlib.contextmanager
def init_on_device(device: Union[torch.device, str], include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Create models with all parameters on ``device``; buffers too with ``include_buffers`` (default: off, or
    the ``HASTEN_INIT_INCLUDE_BUFFERS`` environment variable).

    With ``include_buffers`` every tensor made inside the context goes to ``device`` (PyTorch's device
    context). Without it, parameters are moved to ``device`` as modules register them; a parameter registered
    twice (weight tying during construction) maps to the same moved parameter, so ties survive.
    """
    if include_buffers is None:
        include_buffers = _include_buffers_default()
    device = torch.device(device)
    if include_buffers:
        with device:
            yield
        return

    original_register = nn.Module.register_parameter
    moved: dict[int, tuple[weakref.ref, nn.Parameter]] = {}  # id(original) -> (weak ref to it, its moved copy)

    def register_on_device(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original_register(module, name, param)
        if param is None or param.device == device:
            return  # e.g. ``self.b.weight = self.a.weight``: already moved, keep the very same object (the tie)
        known = moved.get(id(param))
        if known is not None and known[0]() is param:
            module._parameters[name] = known[1]
            return
        attributes = dict(param.__dict__)
        new_param = type(param)(param.to(device), requires_grad=param.requires_grad)
        new_param.__dict__.update(attributes)
        module._parameters[name] = new_param
        key = id(param)
        # a weak reference: the original (often a large CPU tensor) must be freed as soon as nobody holds it
        moved[key] = (weakref.ref(param, lambda _, key=key: moved.pop(key, None)), new_param)

    nn.Module.register_parameter = register_on_device
    try:
        yield
    finally:
        nn.Module.register_parameter = original_register
