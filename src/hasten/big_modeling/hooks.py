"""Hooks that run around a module's ``forward``: move inputs to the module's device, bring offloaded weights in
before the call and drop them after, move outputs back.

A hook is installed by replacing the instance's ``forward`` with a wrapper (the original is kept as
``_old_forward``, the hook as ``_hf_hook``: the attribute names Accelerate and Transformers look for). Unlike
PyTorch's forward pre/post hooks this sees keyword arguments, can run the call under ``no_grad``, and also
runs when ``module.forward(...)`` is called directly. The wrapper carries the original's signature, so code
that inspects ``model.forward`` keeps working.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ..collectives.operations import find_device, send_to_device
from ..core.aliases import Device
from .module_tensors import get_non_persistent_buffers, get_tensor, named_module_tensors
from .offload import PrefixedDataset
from .tensor_placement import set_module_tensor_to_device

__all__ = ["ModelHook", "SequentialHook", "add_hook_to_module", "remove_hook_from_module", "remove_hook_from_submodules",
           "AlignDevicesHook", "attach_execution_device_hook", "attach_align_device_hook",
           "attach_align_device_hook_on_blocks", "CpuOffload", "UserCpuOffloadHook"]

_META = torch.device("meta")

# What ``pre_forward`` returns: the positional and keyword arguments the forward will get.
ForwardArguments = tuple[tuple[Any, ...], dict[str, Any]]
# data pointer of a tied weight -> {device: its copy there}, shared by the hooks of one model
TiedParamsMap = dict[int, dict[Device, torch.Tensor]]
# attributes dispatch_model adds to a model (guarded .to/.cuda); removing the hook removes them too
_ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")


class ModelHook:
    """Callbacks around a module's forward. Subclass and override what you need.

    ``no_grad = True`` runs the wrapped forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        """Called before forward; returns the (possibly changed) ``(args, kwargs)``."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after forward; returns the (possibly changed) output."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run one after the other at every event (in the order given)."""

    def __init__(self, *hooks: ModelHook):
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _is_graph_module(module: nn.Module) -> bool:
    # torch.fx builds a class per GraphModule and calls the class's forward: patch it there
    return "GraphModuleImpl" in str(type(module))


def _forward_with_hook(module: nn.Module, *args, **kwargs):
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    with torch.no_grad() if hook.no_grad else contextlib.nullcontext():
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (in place; the module is also returned).

    A module holds one hook: a new one replaces the old (whose ``detach_hook`` is not called), unless
    ``append`` chains both in a ``SequentialHook``.
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        original = module._old_forward
    else:
        original = module.forward
        module._old_forward = original
    module = hook.init_hook(module)
    module._hf_hook = hook
    # a partial (not a closure) so that copy.deepcopy / pickle of the module keep the wrapper pointing at the copy
    forward_with_hook = functools.update_wrapper(functools.partial(_forward_with_hook, module), original)
    if _is_graph_module(module):
        module.__class__.forward = forward_with_hook
    else:
        module.forward = forward_with_hook
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of all its submodules with ``recurse``) and restore its forward."""
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        original = module._old_forward
        delattr(module, "_old_forward")
        if _is_graph_module(module):
            module.__class__.forward = original
        elif getattr(original, "__self__", None) is module and getattr(original, "__func__", None) is type(module).forward:
            module.__dict__.pop("forward", None)  # back to the class's forward, no instance attribute left
        else:
            module.forward = original
    for name in _ADDED_ATTRIBUTES:
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of every submodule."""
    remove_hook_from_module(module, recurse=True)


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: inputs are moved there, and so are its weights.

    Args:
        execution_device: where inputs and weights go before forward.
        offload: keep the weights off the device (on meta) between calls; before each forward they are read
            from ``weights_map`` (a mapping name -> tensor, e.g. a CPU state dict or an
            ``OffloadedWeightsLoader`` over a disk folder) and after it they are dropped again.
        io_same_device: return outputs on the device the inputs came from.
        weights_map: see ``offload``; default: a CPU copy of the module's weights made at attach time.
        offload_buffers: offload buffers as well (else they live on ``execution_device``).
        place_submodules: handle the weights of all submodules, not only the module's own.
        skip_keys: keys of keyword/dict inputs and outputs that are not moved.
        tied_params_map: data pointer -> {device: tensor}, shared between hooks so a tied weight is brought to
            a device once, not once per name.
    """

    def __init__(self, execution_device: Optional[Device] = None, offload: bool = False,
                 io_same_device: bool = False, weights_map: Optional[Mapping[str, torch.Tensor]] = None,
                 offload_buffers: bool = False, place_submodules: bool = False,
                 skip_keys: Optional[Union[str, list[str]]] = None, tied_params_map: Optional[TiedParamsMap] = None):
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device = None
        self.param_original_devices: dict = {}
        self.buffer_original_devices: dict = {}
        self.tied_params_names: set = set()
        self.tied_pointers_to_remove: set = set()

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module):
        """Names of the tensors this hook brings in and drops (non-persistent buffers never leave)."""
        return [name for name, _ in named_module_tensors(module, include_buffers=self.offload_buffers,
                                                          recurse=self.place_submodules, remove_non_persistent=True)]

    def init_hook(self, module: nn.Module) -> nn.Module:
        if self.execution_device in ("meta", _META):
            self.tied_params_map = None  # nothing real to share on meta
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, self.execution_device,
                                                tied_params_map=self.tied_params_map, clear_cache=False)
            return module
        self.original_devices = {name: t.device for name, t in named_module_tensors(module, recurse=self.place_submodules)}
        if self.weights_map is None:
            self.weights_map = {name: t.to("cpu") for name, t in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=self.place_submodules)}
        for name in self._offloaded(module):
            if self.tied_params_map is not None and get_tensor(module, name).data_ptr() in self.tied_params_map:
                self.tied_params_names.add(name)
            set_module_tensor_to_device(module, name, "meta", clear_cache=False)
        if self.execution_device is not None:
            if not self.offload_buffers:
                kept = [name for name, _ in module.named_buffers(recurse=self.place_submodules)]
            else:
                kept = list(get_non_persistent_buffers(module, recurse=self.place_submodules))
            for name in kept:
                set_module_tensor_to_device(module, name, self.execution_device,
                                            tied_params_map=self.tied_params_map, clear_cache=False)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove = set()
            for name in self._offloaded(module):
                value = self.weights_map[name]
                shared = self.tied_params_map
                if shared is not None and name in self.tied_params_names and value.data_ptr() not in shared:
                    shared[value.data_ptr()] = {}
                if shared is not None and value.data_ptr() in shared and self.execution_device not in shared[value.data_ptr()]:
                    self.tied_pointers_to_remove.add((value.data_ptr(), self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            tied_params_map=shared, clear_cache=False)
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self._offloaded(module):
                set_module_tensor_to_device(module, name, "meta", clear_cache=False)
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map.get(pointer, {}).pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            for name, device in self.original_devices.items():
                if device != _META:
                    value = self.weights_map.get(name, None) if isinstance(self.weights_map, Mapping) else None
                    if value is None and get_tensor(module, name).device == _META:
                        continue
                    set_module_tensor_to_device(module, name, device, value=value)
        return module


def attach_execution_device_hook(module: nn.Module, execution_device: Device,
                                 skip_keys: Optional[Union[str, list[str]]] = None,
                                 preload_module_classes: Optional[list[str]] = None,
                                 tied_params_map: Optional[TiedParamsMap] = None) -> None:
    """Give every submodule that has weights a hook that moves its inputs to ``execution_device`` (no offload)."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map))
    if preload_module_classes is not None and module.__class__.__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: Optional[Device] = None, offload: bool = False,
                             weights_map: Optional[Mapping[str, torch.Tensor]] = None, offload_buffers: bool = False,
                             module_name: str = "", skip_keys: Optional[Union[str, list[str]]] = None,
                             preload_module_classes: Optional[list[str]] = None,
                             tied_params_map: Optional[TiedParamsMap] = None) -> None:
    """Give every submodule with weights of its own an ``AlignDevicesHook`` (offloading them if ``offload``).

    Instances of ``preload_module_classes`` get one hook for their whole subtree, which loads all their
    weights before their forward (for modules that use a child's weights without calling the child).
    """
    has_own_tensors = next(named_module_tensors(module), None) is not None
    whole = offload and preload_module_classes is not None and module.__class__.__name__ in preload_module_classes
    if has_own_tensors or whole:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device=execution_device, offload=offload,
            weights_map=PrefixedDataset(weights_map, prefix) if weights_map is not None else None,
            offload_buffers=offload_buffers, place_submodules=whole, skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload, weights_map=weights_map,
                                 offload_buffers=offload_buffers, module_name=f"{module_name}.{name}" if module_name else name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module,
                                       execution_device: Optional[Union[Device, Mapping[str, Device]]] = None,
                                       offload: Union[bool, Mapping[str, bool]] = False,
                                       weights_map: Optional[Mapping[str, torch.Tensor]] = None,
                                       offload_buffers: bool = False, module_name: str = "",
                                       skip_keys: Optional[Union[str, list[str]]] = None,
                                       preload_module_classes: Optional[list[str]] = None,
                                       tied_params_map: Optional[TiedParamsMap] = None) -> None:
    """Attach the hooks a device map needs, block by block.

    ``execution_device`` and ``offload`` are one value for the whole module or dicts keyed by block name (the
    keys of a device map). A block that is not offloaded gets one hook placing all its weights on its device;
    an offloaded block gets offloading hooks on each of its submodules; the root gets a hook that returns
    outputs on the inputs' device.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, dict):
        if not offload:
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, io_same_device=True,
                                                        skip_keys=skip_keys, place_submodules=True,
                                                        tied_params_map=tied_params_map))
        else:
            attach_align_device_hook(module, execution_device=execution_device, offload=True, weights_map=weights_map,
                                     offload_buffers=offload_buffers, module_name=module_name, skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
        return
    if not isinstance(execution_device, Mapping):
        execution_device = {key: execution_device for key in offload}
    if not isinstance(offload, Mapping):
        offload = {key: offload for key in execution_device}

    if module_name in execution_device and module_name in offload and not offload[module_name]:
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device[module_name],
                                                    offload_buffers=offload_buffers, io_same_device=(module_name == ""),
                                                    place_submodules=True, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name], skip_keys=skip_keys,
                                     tied_params_map=tied_params_map)
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(module, execution_device=execution_device[module_name], offload=True,
                                 weights_map=weights_map, offload_buffers=offload_buffers, module_name=module_name,
                                 skip_keys=skip_keys, preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device[module_name],
                                                        io_same_device=(module_name == ""), skip_keys=skip_keys,
                                                        tied_params_map=tied_params_map))
        attach_execution_device_hook(module, execution_device[module_name], preload_module_classes=preload_module_classes,
                                     skip_keys=skip_keys, tied_params_map=tied_params_map)
    elif module_name == "":
        add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device.get(""), io_same_device=True,
                                                    skip_keys=skip_keys, tied_params_map=tied_params_map))

    for name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device=execution_device, offload=offload,
                                           weights_map=weights_map, offload_buffers=offload_buffers,
                                           module_name=f"{module_name}.{name}" if module_name else name,
                                           preload_module_classes=preload_module_classes, skip_keys=skip_keys,
                                           tied_params_map=tied_params_map)


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU until its forward, then move it to ``execution_device`` and leave it there
    (call ``UserCpuOffloadHook.offload()`` to send it back). ``prev_module_hook`` offloads the previous model of
    a pipeline just before this one runs."""

    def __init__(self, execution_device: Optional[Device] = None,
                 prev_module_hook: Optional[UserCpuOffloadHook] = None):
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            from ..state import PartialState

            execution_device = PartialState().default_device
        self.execution_device = execution_device

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        if isinstance(self.prev_module_hook, UserCpuOffloadHook):
            previous = next(self.prev_module_hook.model.parameters(), None)
            if previous is not None and previous.device != torch.device("cpu"):
                self.prev_module_hook.offload()
                from .device_memory import empty_cache

                empty_cache(previous.device)
        first = next(module.parameters(), None)
        if first is not None and first.device == torch.device(self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` sends the model back to the CPU, ``remove()``
    takes the hook off."""

    def __init__(self, model: nn.Module, hook: ModelHook):
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)
