"""Full (unsharded) model and optimizer states of a DeepSpeed engine, in torch's own layouts, both ways.

ZeRO keeps the fp32 master weights and the optimizer's moments in flat partitions spread over the ranks.
DeepSpeed's tensor-fragment API (``deepspeed.utils.safe_get_full_fp32_param`` and friends) assembles or scatters
one parameter's full value; these functions walk the model's parameters with it, so that:

- ``full_optimizer_state`` is what ``torch.optim.AdamW.state_dict()`` of the same model would be (positions in
  the order the optimizer was given its parameters), which any strategy can load;
- ``load_full_state`` puts a full model and optimizer state (another strategy's checkpoint, or a DeepSpeed one
  saved with another ZeRO stage or number of processes) into the engine: master weights, the model's own
  (possibly 16-bit) weights and the moments.

Every function is collective under ZeRO: every rank calls it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ...big_modeling.module_tensors import get_non_persistent_buffers

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

__all__ = ["full_optimizer_state", "load_full_state", "engine_kind", "full_model_state", "expected_model_state",
           "undo_warmup_step"]


def engine_kind(engine: DeepSpeedEngine) -> str:
    """"zero3", "fragments" (ZeRO 1/2 or DeepSpeed's bf16 optimizer: fp32 master in flat partitions), "torch"
    (stage 0 in fp32: the client's torch optimizer itself) or "none" (an engine without an optimizer)."""
    if engine.zero_optimization_stage() == 3:
        return "zero3"
    optimizer = engine.optimizer
    if optimizer is None:
        return "none"
    params = [p for p in engine.module.parameters() if p.requires_grad]
    if params and hasattr(params[0], "_hp_mapping"):
        return "fragments"
    return "torch"


def _base_optimizer(engine):
    optimizer = engine.optimizer
    return getattr(optimizer, "optimizer", optimizer)


def _per_group_names(names: list) -> list:
    return [name for group in names for name in group]


def full_model_state(engine: DeepSpeedEngine, fp32: bool = False) -> dict:
    """The module's state dict with every parameter whole, on the CPU, on every rank (ZeRO-3 gathers).
    ``fp32``: the optimizer's master weights instead of the module's (16-bit) ones where they differ."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    module = engine.module
    kind = engine_kind(engine)
    state = {}
    if kind == "zero3":
        params = [p for p in module.parameters()]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    else:
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    if fp32:
        for name, (param, master) in _unfused_masters(engine).items():
            if name in state:
                state[name] = master.detach().cpu().reshape(state[name].shape).clone()
    if fp32 and kind in ("zero3", "fragments"):
        for name, param in module.named_parameters(remove_duplicate=False):
            full = safe_get_full_fp32_param(param) if param.requires_grad and name in state else None
            if full is not None:
                state[name] = full.detach().cpu().reshape(state[name].shape).clone()
    return state


def expected_model_state(engine: DeepSpeedEngine) -> dict:
    """Every name of the module's state dict with a tensor of its full shape (ZeRO-3 parameters are empty
    placeholders in the module: their full shape is ``ds_shape``)."""
    module = engine.module
    state = module.state_dict(keep_vars=True)
    if engine.zero_optimization_stage() != 3:
        return state
    shapes = {}
    for name, value in state.items():
        shape = getattr(value, "ds_shape", None)
        shapes[name] = torch.empty(tuple(shape), dtype=value.dtype, device="meta") if shape is not None else value
    return shapes


def _module_parameters(engine, names: list) -> list:
    named = dict(engine.module.named_parameters(remove_duplicate=False))
    missing = [name for name in names if name not in named]
    if missing:
        raise KeyError(f"The DeepSpeed engine's model has no parameter {missing[0]!r}.")
    return [named[name] for name in names]


def full_optimizer_state(engine: DeepSpeedEngine, names: list[list[str]]) -> dict:
    """The optimizer's state as torch's ``state_dict()`` lays it out: ``{"state": {position: {...}},
    "param_groups": [...]}``; ``names``: the parameters' names per group, in the order the optimizer had them."""
    from deepspeed.utils import safe_get_full_optimizer_state

    kind = engine_kind(engine)
    base = _base_optimizer(engine)
    if kind == "torch":
        return base.state_dict()
    flat_names = _per_group_names(names)
    params = _module_parameters(engine, flat_names)
    _link_fragments(engine)
    keys, scalars = _state_keys(base)
    state = {}
    for position, param in enumerate(params):
        entry = dict(scalars)
        for key in keys:
            value = safe_get_full_optimizer_state(param, key)
            if value is not None:
                shape = param.ds_shape if kind == "zero3" else param.shape
                entry[key] = value.detach().cpu().reshape(tuple(shape)).clone()
        if len(entry) > len(scalars):
            state[position] = entry
    groups, start = [], 0
    for group_names, group in zip(names, base.param_groups):
        hyper = {k: v for k, v in group.items() if k != "params"}
        groups.append({**hyper, "params": list(range(start, start + len(group_names)))})
        start += len(group_names)
    return {"state": state, "param_groups": groups}


def _state_keys(base) -> tuple:
    """The names of the base optimizer's per-element state tensors, and its scalar entries (``step``)."""
    keys, scalars = [], {}
    for entry in base.state.values():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if key not in keys:
                    keys.append(key)
            else:
                scalars.setdefault(key, value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value)
        break
    return keys, scalars


def load_full_state(engine: DeepSpeedEngine, model_state: Optional[dict], optimizer_state: Optional[dict],
                    names: list[list[str]], strict: bool = True) -> None:
    """Put a full model state (module names) and a full optimizer state (torch's layout, positions in ``names``
    order) into ``engine``: master weights, module weights, moments and step counts."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    module = engine.module
    kind = engine_kind(engine)
    if model_state is not None:
        named = dict(module.named_parameters())
        # the buffers a state dict holds: non-persistent ones (a rotary embedding's inv_freq) are never saved
        transient = get_non_persistent_buffers(module, recurse=True, fqns=True)
        buffers = {name: buffer for name, buffer in module.named_buffers() if name not in transient}
        if kind == "zero3":
            with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=0):
                _copy_into(named, buffers, model_state, strict)
        else:
            _copy_into(named, buffers, model_state, strict)
        with torch.no_grad():
            for name, (param, master) in _unfused_masters(engine).items():
                if name in model_state:
                    master.copy_(model_state[name].to(master.dtype).reshape(master.shape))
        if kind in ("zero3", "fragments"):
            for name, param in named.items():
                if param.requires_grad and name in model_state:
                    safe_set_full_fp32_param(param, model_state[name].to(torch.float32).to(_device(param)))
    if optimizer_state is None:
        return
    base = _base_optimizer(engine)
    if kind == "torch":
        base.load_state_dict(optimizer_state)
        return
    params = _module_parameters(engine, _per_group_names(names))
    template = next(iter(optimizer_state["state"].values()), None)
    if template is not None:
        _materialize_state(engine, template)
        _link_fragments(engine)
    keys, _ = _state_keys(base)
    step = None
    for position, param in enumerate(params):
        entry = optimizer_state["state"].get(position)
        if entry is None:
            continue
        for key, value in entry.items():
            if key in keys:
                safe_set_full_optimizer_state(param, torch.as_tensor(value).to(torch.float32).to(_device(param)), key)
            elif key == "step":
                step = value
    if step is not None:
        for entry in base.state.values():
            if "step" in entry:
                current = entry["step"]
                entry["step"] = (torch.as_tensor(step, dtype=current.dtype, device=current.device).clone()
                                 if isinstance(current, torch.Tensor) else type(current)(torch.as_tensor(step).item()))
    for live, saved in zip(base.param_groups, optimizer_state["param_groups"]):
        live.update({key: value for key, value in saved.items() if key != "params"})


def _unfused_masters(engine) -> dict:
    """``{name: (16-bit parameter, its fp32 master)}`` for DeepSpeed's unfused 16-bit optimizer (bf16 / fp16 at
    stage 0), which keeps one fp32 copy per parameter; empty for other optimizers."""
    optimizer = engine.optimizer
    low, high = getattr(optimizer, "fp16_groups", None), getattr(optimizer, "fp32_groups", None)
    if not low or not high or engine.zero_optimization_stage() != 0:
        return {}
    masters = {id(p): m for lows, highs in zip(low, high) for p, m in zip(lows, highs)}
    return {name: (param, masters[id(param)]) for name, param in engine.module.named_parameters()
            if id(param) in masters}


def undo_warmup_step(engine: DeepSpeedEngine, originals: dict[str, torch.Tensor]) -> None:
    """DeepSpeed's unfused 16-bit optimizer (stage 0) takes one optimizer step on zero gradients when it is built,
    which decays the weights and counts a step PyTorch never took: put the weights as given back and clear the
    optimizer's state, so training starts where the same optimizer in plain PyTorch would."""
    masters = _unfused_masters(engine)
    if not masters:
        return
    with torch.no_grad():
        for name, (param, master) in masters.items():
            if name in originals:
                master.copy_(originals[name].to(master.dtype))
                param.data.copy_(originals[name].to(param.dtype))
    _base_optimizer(engine).state.clear()


def _flat_partitions(engine) -> list:
    """The fp32 flat partitions the base optimizer keeps its state for (ZeRO-3, ZeRO 1/2, the bf16 optimizer)."""
    optimizer = engine.optimizer
    for attribute in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
        flats = getattr(optimizer, attribute, None)
        if flats:
            return list(flats)
    return [p for group in _base_optimizer(engine).param_groups for p in group["params"]]


def _link_fragments(engine) -> None:
    """Point every parameter at its slice of the optimizer's state. DeepSpeed links them once, after the first
    group's first step, when later groups have no state yet: with several groups those stay unlinked."""
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None and _base_optimizer(engine).state:
        engine.optimizer._hp_optimizer_states_linked = False
        link()


def _materialize_state(engine, template: dict) -> None:
    """Create the base optimizer's state for its flat partitions where it has none yet (torch's optimizers create
    it at their first step): zeros shaped like each partition, scalars at 0, the fields of ``template``."""
    base = _base_optimizer(engine)
    for flat in _flat_partitions(engine):
        if base.state.get(flat):
            continue
        entry = {}
        for key, value in template.items():
            value = torch.as_tensor(value) if not isinstance(value, (int, float, bool)) else value
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                entry[key] = torch.zeros_like(flat, dtype=torch.float32)
            elif isinstance(value, torch.Tensor):
                entry[key] = torch.zeros((), dtype=value.dtype)
            else:
                entry[key] = type(value)(0)
        base.state[flat] = entry


def _device(param) -> torch.device:
    return param.device


def _copy_into(params: dict, buffers: dict, state: dict, strict: bool) -> None:
    if strict:
        missing = [name for name in list(params) + list(buffers) if name not in state]
        if missing:
            raise KeyError(f"The state to load has no {missing[0]!r} (and {len(missing) - 1} more names of the model).")
    with torch.no_grad():
        for name, tensor in list(params.items()) + list(buffers.items()):
            if name in state:
                tensor.data.copy_(state[name].to(tensor.dtype).reshape(tensor.shape))
