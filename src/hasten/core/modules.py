"""Getting the user's model back out of the wrappers that training adds, and walking a model's modules.

Wrappers recognised: ``DistributedDataParallel``, ``DataParallel``, FSDP1's ``FullyShardedDataParallel``,
DeepSpeed's ``DeepSpeedEngine``, torch_xla's FSDP wrappers and ``torch.compile``'s ``OptimizedModule``. A
wrapper type can only wrap a model if its module was imported, so the checks look in ``sys.modules`` and
never import DeepSpeed, FSDP or torch_xla themselves.
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Optional

import torch
from torch import nn

from .aliases import Device

__all__ = ["extract_model_from_parallel", "get_module_children_bottom_up", "is_peft_model", "check_device_same",
           "id_tensor_storage", "check_tied_parameters_in_config", "model_has_dtensor", "get_model_tp_size",
           "recursive_getattr"]

logger = logging.getLogger(__name__)

# (module, class) of wrappers that keep the wrapped model in ``.module``.
_PARALLEL_WRAPPERS = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel"),
    ("torch.nn.parallel.data_parallel", "DataParallel"),
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine"),
    ("deepspeed", "DeepSpeedEngine"),
    ("torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel", "XlaFullyShardedDataParallel"),
    ("torch_xla.experimental.spmd_fully_sharded_data_parallel", "SpmdFullyShardedDataParallel"),
    ("torch_xla.distributed.spmd", "SpmdFullyShardedDataParallel"),
)


def _wrapper_types() -> tuple:
    types = []
    for module_name, class_name in _PARALLEL_WRAPPERS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(cls, type) and cls not in types:
            types.append(cls)
    return tuple(types)


def _compiled_type():
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def _is_compiled(model) -> bool:
    compiled = _compiled_type()
    return compiled is not None and isinstance(model, compiled)


def _unwrap_parallel(model, wrappers: tuple):
    while wrappers and isinstance(model, wrappers):
        model = model.module
    return model


def _unwrap_children(module, wrappers: tuple):
    """Replace every wrapped submodule of ``module`` (at any depth) by the model it wraps."""
    module = _unwrap_parallel(module, wrappers)
    for name, child in list(module.named_children()):
        unwrapped = _unwrap_children(child, wrappers)
        if unwrapped is not child:
            setattr(module, name, unwrapped)
    return module


def _remove_fp32_wrapper(model) -> None:
    """Undo the mixed-precision forward wrapper (autocast + outputs to fp32) added when the model was prepared.

    Preparing saves the forward it replaced as ``model._original_forward``; it is put back. When that was
    simply the class's own ``forward``, the instance attribute is deleted instead, so the model is exactly
    as before (and pickles the same).
    """
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        class_forward = getattr(type(model), "forward", None)
        bound_to_model = getattr(original, "__self__", None) is model
        if original is class_forward or (bound_to_model and getattr(original, "__func__", None) is class_forward):
            model.__dict__.pop("forward", None)
        else:
            model.forward = original
    if getattr(model, "_converted_to_transformer_engine", False):
        logger.warning(
            "The model's layers were converted to Transformer Engine layers for fp8; they are left as they are "
            "(only the fp32 output wrapper was removed)."
        )


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> nn.Module:
    """Return the model inside its distributed (and optionally compiled / mixed-precision) wrappers.

    Parameters:
        model: the prepared model (``DistributedDataParallel``, FSDP1, ``DeepSpeedEngine``, compiled ...).
        keep_fp32_wrapper: keep the forward wrapper that runs autocast and converts outputs to fp32; with
            ``False`` the model's original ``forward`` is restored.
        keep_torch_compile: when the model was compiled, return the compiled wrapper (with the unwrapped model
            inside it); with ``False`` return the plain model.
        recursive: also unwrap distributed wrappers around submodules, at any depth (e.g. FSDP wrapping
            each layer). Only known wrapper types are unwrapped: a submodule that merely has an attribute named
            ``module`` is left alone.
    """
    compiled_wrapper = None
    if _is_compiled(model):
        compiled_wrapper, model = model, model._orig_mod
    elif isinstance(model, nn.Module) and isinstance(model.__dict__.get("_orig_mod"), nn.Module):
        # Regional compilation: a copy of the model whose repeated blocks are compiled, keeping the original.
        compiled_wrapper, model = model, model.__dict__["_orig_mod"]

    wrappers = _wrapper_types()
    model = _unwrap_parallel(model, wrappers)
    if recursive:
        model = _unwrap_children(model, wrappers)
    if not keep_fp32_wrapper:
        _remove_fp32_wrapper(model)

    if keep_torch_compile and compiled_wrapper is not None:
        if _is_compiled(compiled_wrapper):
            compiled_wrapper._orig_mod = model
        else:
            compiled_wrapper.__dict__["_orig_mod"] = model
        return compiled_wrapper
    return model


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list:
    """Every module of ``model``, children before their parent, ending with ``model`` itself.

    The order is a post-order walk that visits children in definition order (the order ``named_children``
    gives). With ``return_fqns`` each entry is ``(qualified_name, module)``, the model's name being ``""``.
    A module reachable through two parents is listed once per parent.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"get_module_children_bottom_up takes a torch.nn.Module, got {type(model).__name__}.")
    ordered = []
    # Iterative post-order: (name, module, children_expanded)
    stack = [("", model, False)]
    while stack:
        name, module, expanded = stack.pop()
        if expanded:
            ordered.append((name, module) if return_fqns else module)
            continue
        stack.append((name, module, True))
        children = [(f"{name}.{child_name}" if name else child_name, child)
                    for child_name, child in module.named_children()]
        for child_entry in reversed(children):
            stack.append((*child_entry, False))
    return ordered


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` (inside its training wrappers) is a PEFT ``PeftModel``."""
    peft = sys.modules.get("peft")  # a PeftModel can only exist once peft was imported
    peft_model = getattr(peft, "PeftModel", None)
    return peft_model is not None and isinstance(extract_model_from_parallel(model), peft_model)


def check_device_same(first_device: Device, second_device: Device) -> bool:
    """Whether two devices are the same one, counting ``cuda`` and ``cuda:0`` (any accelerator) as equal."""
    first, second = torch.device(first_device), torch.device(second_device)
    if first.type != second.type:
        return False
    if first.type != "cpu":
        first = torch.device(first.type, 0 if first.index is None else first.index)
        second = torch.device(second.type, 0 if second.index is None else second.index)
    return first == second


def id_tensor_storage(tensor: torch.Tensor) -> tuple:
    """``(device, storage address, storage bytes)``: equal for tensors that share one storage (tied weights,
    views), unique among live storages. All meta tensors of one size compare equal (they have no memory)."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):  # storages without memory (meta, some wrapper subclasses)
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a Transformers model's configuration says some weights are tied (word embeddings with the
    output layer, encoder with decoder, or a module that ties its own); False for other models."""
    if "PreTrainedModel" not in [cls.__name__ for cls in type(model).__mro__]:
        return False
    config = getattr(model, "config", None)
    decoder_config = None
    if config is not None:
        decoder_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    tied_word_embeddings = bool(decoder_config is not None and getattr(decoder_config, "tie_word_embeddings", False)
                                and model.get_output_embeddings())
    tied_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)
                                and getattr(config, "tie_encoder_decoder", False))
    tied_module = any(hasattr(module, "_tie_weights") for module in model.modules())
    return tied_word_embeddings or tied_encoder_decoder or tied_module


def model_has_dtensor(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (the model is sharded by FSDP2 or tensor parallel)."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def get_model_tp_size(model: Any) -> Optional[int]:
    """The tensor-parallel degree a Transformers model was sharded with, or None.

    ``transformers < 5`` records it as ``model.tp_size``; later versions in ``model.config.distributed_config``.
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return tp_size
    distributed_config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed_config, dict):
        return distributed_config.get("tp_size")
    return getattr(distributed_config, "tp_size", None)


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``."""
    return functools.reduce(getattr, attr.split("."), obj)
