"""hasten.precision: the grad scaler and the autocast context follow the run's device and mixed precision."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from hasten.config.enums import DistributedType
from hasten.precision.autocast import get_grad_scaler, get_mixed_precision_context_manager
from hasten.state import AcceleratorState, PartialState

EXPECTED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Options:
    """Anything with ``to_kwargs()`` (what an AutocastKwargs handler offers)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def to_kwargs(self):
        return self.kwargs


def autocast_facts(device_type: str = "cpu"):
    """(enabled, dtype, output dtype of a Linear) inside the current context, straight from torch."""
    output = torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type), output


def test_grad_scaler_for_the_machine_without_state():
    scaler = get_grad_scaler(init_scale=16.0, growth_interval=3)
    assert type(scaler) is torch.amp.GradScaler and scaler._device == EXPECTED_DEVICE
    assert scaler.get_scale() == 16.0 and scaler.get_growth_interval() == 3


def test_grad_scaler_follows_the_state_device():
    PartialState(cpu=True)
    scaler = get_grad_scaler()
    assert scaler._device == "cpu" and scaler.is_enabled()
    assert get_grad_scaler(enabled=False).is_enabled() is False
    assert get_grad_scaler(device="meta")._device == "meta"  # an explicit device wins


def test_grad_scaler_under_fsdp():
    PartialState(cpu=True)
    for kind in (DistributedType.FSDP, "FSDP"):
        scaler = get_grad_scaler(kind, init_scale=4.0)
        assert isinstance(scaler, ShardedGradScaler) and scaler._device == "cpu" and scaler.get_scale() == 4.0
    assert type(get_grad_scaler(DistributedType.MULTI_CPU)) is torch.amp.GradScaler
    with pytest.raises(ValueError, match="distributed_type"):
        get_grad_scaler("NOT_A_TYPE")


def test_no_autocast_when_mixed_precision_is_off():
    AcceleratorState(mixed_precision="bf16", cpu=True)
    context = get_mixed_precision_context_manager(native_amp=False)
    assert isinstance(context, contextlib.nullcontext)
    with context:
        assert autocast_facts() == (False, torch.get_autocast_dtype("cpu"), torch.float32)


@pytest.mark.parametrize("mixed_precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                                    ("fp8", torch.bfloat16)])
def test_autocast_dtype_follows_the_accelerator_state(mixed_precision, dtype):
    AcceleratorState(mixed_precision=mixed_precision, cpu=True)
    with get_mixed_precision_context_manager(native_amp=True):
        assert autocast_facts() == (True, dtype, dtype)
    assert not torch.is_autocast_enabled("cpu")


def test_engines_that_cast_themselves_get_the_device_default():
    AcceleratorState(mixed_precision="bf16", cpu=True)
    PartialState().distributed_type = DistributedType.DEEPSPEED  # as the DeepSpeed strategy would set it
    with torch.autocast("cpu"):
        default = torch.get_autocast_dtype("cpu")
    with get_mixed_precision_context_manager(native_amp=True):
        assert autocast_facts()[:2] == (True, default)


def test_autocast_without_accelerator_state_uses_the_device_default():
    PartialState(cpu=True)
    with torch.autocast("cpu"):
        default = torch.get_autocast_dtype("cpu")
    with get_mixed_precision_context_manager(native_amp=True):
        assert autocast_facts()[:2] == (True, default)


def test_autocast_kwargs():
    AcceleratorState(mixed_precision="bf16", cpu=True)
    with get_mixed_precision_context_manager(True, {"enabled": False}):
        assert not torch.is_autocast_enabled("cpu")
    with get_mixed_precision_context_manager(True, Options(cache_enabled=False)):
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()
    with get_mixed_precision_context_manager(True, {"dtype": torch.float16}):  # explicit dtype wins
        assert torch.get_autocast_dtype("cpu") == torch.float16
    with pytest.raises(TypeError, match="autocast_kwargs"):
        get_mixed_precision_context_manager(True, ["enabled"])


def test_autocast_kwargs_handler():
    kwargs_module = pytest.importorskip("hasten.config.kwargs")
    AcceleratorState(mixed_precision="bf16", cpu=True)
    with get_mixed_precision_context_manager(True, kwargs_module.AutocastKwargs(enabled=False)):
        assert not torch.is_autocast_enabled("cpu")
