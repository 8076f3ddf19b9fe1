"""prepare() refuses to train an 8-bit/4-bit model placed where its training would fail, before wrapping it."""
from unittest import mock

import pytest
import torch

import hasten.accelerator as accelerator_module
from hasten import Accelerator
from hasten.quantization.training import check_quantized_model_trainable


def quantized(device_map, flag="is_loaded_in_8bit"):
    model = torch.nn.Linear(2, 2)
    setattr(model, flag, True)
    model.hf_device_map = device_map
    return model


@pytest.mark.parametrize("flag", ["is_loaded_in_8bit", "is_loaded_in_4bit"])
def test_cpu_or_disk_offload_refused_without_multi_backend(flag):
    accelerator = Accelerator(cpu=True)
    for where in ("cpu", "disk"):
        model = quantized({"": where}, flag)
        with mock.patch.object(accelerator_module, "is_bitsandbytes_multi_backend_available", return_value=False), \
                mock.patch.object(accelerator_module, "is_xpu_available", return_value=False):
            with pytest.raises(ValueError, match="CPU or disk offload"):
                accelerator.prepare_model(model)
        assert not accelerator._models and not getattr(model, "_is_accelerate_prepared", False)


def test_cpu_placement_trains_with_multi_backend_and_evaluation_is_not_checked():
    accelerator = Accelerator(cpu=True)
    with mock.patch.object(accelerator_module, "is_bitsandbytes_multi_backend_available", return_value=True):
        prepared = accelerator.prepare_model(quantized({"": "cpu"}))
    assert prepared is not None and len(accelerator._models) == 1
    with mock.patch.object(accelerator_module, "is_bitsandbytes_multi_backend_available", return_value=False):
        accelerator.prepare_model(quantized({"": "cpu"}), evaluation_mode=True)  # inference: nothing to refuse


def test_unquantized_or_undispatched_models_are_not_checked():
    accelerator = Accelerator(cpu=True)
    plain = torch.nn.Linear(2, 2)
    plain.hf_device_map = {"": "cpu"}
    accelerator.prepare_model(plain)
    loaded = torch.nn.Linear(2, 2)
    loaded.is_loaded_in_8bit = True  # no device map: placed like any model
    accelerator.prepare_model(loaded)


def test_placements():
    cpu = torch.device("cpu")
    gpu0, gpu1 = torch.device("cuda", 0), torch.device("cuda", 1)
    model = quantized({"a": 0, "b": 1})
    with pytest.raises(ValueError, match="on multiple devices in any distributed mode"):
        check_quantized_model_trainable(model, distributed=True, device=gpu0, offload_supported=True)
    check_quantized_model_trainable(model, distributed=False, device=gpu0, offload_supported=False)  # naive MP
    with pytest.raises(ValueError, match="on a different device than the one you're training on"):
        check_quantized_model_trainable(quantized({"": 1}), distributed=True, device=gpu0, offload_supported=False)
    with pytest.raises(ValueError, match="different device"):
        check_quantized_model_trainable(quantized({"": "cuda:0"}), distributed=False, device=cpu,
                                        offload_supported=False)
    check_quantized_model_trainable(quantized({"": 1}), distributed=True, device=gpu1, offload_supported=False)
    check_quantized_model_trainable(quantized({"": "cuda"}), distributed=False, device=gpu0, offload_supported=False)
    with pytest.raises(ValueError, match="CPU or disk offload"):
        check_quantized_model_trainable(quantized({"a": 0, "b": "cpu"}), distributed=False, device=gpu0,
                                        offload_supported=False)
