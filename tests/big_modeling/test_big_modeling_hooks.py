"""Forward hooks: attaching, chaining, removing, and moving inputs / weights / outputs between devices.

This machine has no GPU, so device movement is observed between the CPU and the meta device.
"""
from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn as nn

import hasten.hooks as compat_hooks
from hasten.big_modeling import (AlignDevicesHook, CpuOffload, ModelHook, SequentialHook, UserCpuOffloadHook,
                                 add_hook_to_module, attach_align_device_hook, attach_align_device_hook_on_blocks,
                                 remove_hook_from_module, remove_hook_from_submodules)


class AddOne(ModelHook):
    def pre_forward(self, module, *args, **kwargs):
        return tuple(a + 1 for a in args), kwargs


class Double(ModelHook):
    def post_forward(self, module, output):
        return output * 2


class Placed:
    """An output that can be moved like a tensor but holds no data (meta tensors cannot be copied back)."""

    def __init__(self, device):
        self.device = torch.device(device)

    def to(self, device, non_blocking=False):
        return Placed(device)


class Recorder(nn.Module):
    """Records the devices its inputs arrive on; returns a movable marker of where it ran."""

    def __init__(self, marker=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))
        self.seen = []
        self.marker = marker

    def forward(self, x, *, extra=None):
        self.seen.append((x.device.type, None if extra is None else extra.device.type, self.weight.device.type))
        out = x * self.weight
        return Placed(out.device) if self.marker else out


def test_pre_and_post_forward_and_signature_are_kept():
    layer = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    expected = layer(x + 1) * 2
    add_hook_to_module(layer, AddOne())
    add_hook_to_module(layer, Double(), append=True)
    assert isinstance(layer._hf_hook, SequentialHook)
    assert torch.allclose(layer(x), expected)
    assert torch.allclose(layer.forward(x), expected)  # a direct .forward call runs the hooks too
    assert list(inspect.signature(layer.forward).parameters) == ["input"]


def test_replace_without_append_and_remove_restores_the_module():
    layer = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    plain = layer(x)
    add_hook_to_module(layer, AddOne())
    add_hook_to_module(layer, Double())  # replaces AddOne
    assert torch.allclose(layer(x), plain * 2)
    remove_hook_from_module(layer)
    assert torch.allclose(layer(x), plain)
    assert "forward" not in layer.__dict__ and not hasattr(layer, "_hf_hook") and not hasattr(layer, "_old_forward")


def test_no_grad_hooks_and_recursive_removal():
    class NoGrad(ModelHook):
        no_grad = True

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    add_hook_to_module(model[0], NoGrad())
    add_hook_to_module(model[1], Double())
    assert not model[0](torch.randn(1, 2)).requires_grad
    remove_hook_from_submodules(model)
    assert model[0](torch.randn(1, 2)).requires_grad and not hasattr(model[1], "_hf_hook")


def test_hooked_modules_deep_copy_with_their_hook():
    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, Double())
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        twin.weight.zero_()
        twin.bias.fill_(1.0)
    assert torch.equal(twin(torch.randn(1, 2)), torch.full((1, 2), 2.0))  # the copy's own weights, hooked


def test_align_devices_moves_inputs_and_brings_outputs_back():
    module = Recorder(marker=True)
    add_hook_to_module(module, AlignDevicesHook(execution_device="meta", io_same_device=True, skip_keys="extra"))
    out = module(torch.ones(2), extra=torch.ones(2))
    assert module.seen == [("meta", "cpu", "meta")]  # input moved, skipped key kept, weight placed at attach time
    assert out.device.type == "cpu"
    assert module.weight.device.type == "meta"


def test_align_devices_offload_brings_weights_in_only_for_the_forward():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    x = torch.randn(4, 3)
    expected = model(x)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights)
    assert model[0].weight.device.type == "meta"
    assert torch.equal(model(x), expected)
    assert model[0].weight.device.type == "meta" and model[2].bias.device.type == "meta"
    remove_hook_from_submodules(model)
    assert model[0].weight.device.type == "cpu" and torch.equal(model(x), expected)  # detach puts weights back


def test_offload_without_a_weights_map_keeps_a_cpu_copy_and_buffers():
    bn = nn.BatchNorm1d(3).eval()
    with torch.no_grad():
        bn.running_mean.fill_(0.5)
    x = torch.randn(2, 3)
    expected = bn(x)
    add_hook_to_module(bn, AlignDevicesHook(execution_device="cpu", offload=True))
    assert bn.weight.device.type == "meta" and bn.running_mean.device.type == "cpu"  # buffers are not offloaded
    assert torch.equal(bn(x), expected)
    bn2 = nn.BatchNorm1d(3).eval()
    add_hook_to_module(bn2, AlignDevicesHook(execution_device="cpu", offload=True, offload_buffers=True))
    assert bn2.running_mean.device.type == "meta"
    assert torch.equal(bn2(x), nn.BatchNorm1d(3).eval()(x))


def test_preload_classes_load_a_whole_subtree():
    class UsesChildWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(2, 2)

        def forward(self, x):
            return x @ self.dense.weight.t() + self.dense.bias  # never calls self.dense

    model = nn.Sequential(UsesChildWeights())
    x = torch.randn(1, 2)
    expected = model(x)
    weights = dict(model.state_dict())
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights,
                             preload_module_classes=["UsesChildWeights"])
    assert torch.equal(model(x), expected)


def test_hooks_on_blocks_follow_a_placement():
    model = nn.Sequential(Recorder(), Recorder(marker=True))
    attach_align_device_hook_on_blocks(model, execution_device={"": "cpu", "0": "cpu", "1": "meta"},
                                       offload={"": False, "0": False, "1": False})
    out = model(torch.ones(2))
    assert model[0].seen == [("cpu", None, "cpu")] and model[1].seen == [("meta", None, "meta")]
    assert out.device.type == "cpu"  # the root hook returns outputs where the inputs were


def test_cpu_offload_hook_moves_the_model_at_forward():
    model = nn.Linear(2, 2)
    hook = CpuOffload(execution_device="meta")
    add_hook_to_module(model, hook)
    assert model.weight.device.type == "cpu"
    out = model(torch.ones(1, 2))
    assert out.device.type == "meta" and model.weight.device.type == "meta"  # stays until offloaded
    user_hook = UserCpuOffloadHook(model, hook)
    with pytest.raises(NotImplementedError):  # meta weights cannot come back: they hold no data
        user_hook.offload()
    user_hook.remove()
    assert not hasattr(model, "_hf_hook")


def test_cpu_offload_hook_offloads_the_previous_model():
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    first_hook = CpuOffload(execution_device="cpu")
    add_hook_to_module(first, first_hook)
    prev = UserCpuOffloadHook(first, first_hook)
    calls = []
    prev.offload = lambda: calls.append("offloaded")
    first.to("meta")  # pretend the first model sits on an accelerator
    add_hook_to_module(second, CpuOffload(execution_device="cpu", prev_module_hook=prev))
    second(torch.ones(1, 2))
    assert calls == ["offloaded"]


def test_compatibility_import_path():
    assert compat_hooks.AlignDevicesHook is AlignDevicesHook
    assert compat_hooks.add_hook_to_module is add_hook_to_module
