"""``FullyShardedDataParallelPlugin``: the options of FSDP (v1 and v2), trained by ``strategies/fsdp/``.

The plugin is a real configuration object: it resolves unset fields from the launcher's environment
(``HASTEN_FSDP_<OPTION>``, or ``ACCELERATE_FSDP_<OPTION>``), validates every choice, and turns strings into the
``torch.distributed.fsdp`` objects (``ShardingStrategy``, ``CPUOffload`` / ``CPUOffloadPolicy``,
``MixedPrecision`` / ``MixedPrecisionPolicy``, ``StateDictType`` and its configs) exactly as Accelerate does.
``Accelerator(fsdp_plugin=...)`` (or the launcher's ``HASTEN_USE_FSDP``) trains with the FSDP2 or FSDP1 strategy.
"""
from __future__ import annotations

import functools
import logging
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

import torch

from ..core.constants import (  # the names Accelerate's configs use; position + 1 is the torch enum's value
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    FSDP_STATE_DICT_TYPE,
)
from .env_fields import as_bool, as_int, from_env

if TYPE_CHECKING:
    from torch.distributed.fsdp import StateDictType

__all__ = ["FullyShardedDataParallelPlugin", "get_module_class_from_name"]

logger = logging.getLogger("hasten.utils.dataclasses")  # the name Accelerate logs these under (as_accelerate/logger_names.py)

_MIXED_PRECISION_DTYPES = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16,
                           "fp32": torch.float32}
_DTYPE_NAMES = ", ".join(sorted({str(dtype) for dtype in _MIXED_PRECISION_DTYPES.values()}))


def get_module_class_from_name(module: torch.nn.Module, name: str) -> Optional[type[torch.nn.Module]]:
    """The class of ``module`` or of one of its descendants whose class name is ``name`` (None if none is)."""
    if module.__class__.__name__ == name:
        return module.__class__
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def _to_torch_enum(enum_cls, value, names: list[str], what: str):
    """``value`` (a member, its number, or one of Accelerate's ``names``) as a member of ``enum_cls``."""
    if isinstance(value, enum_cls):
        return value
    text = str(value).strip().upper()
    number = int(text) if text.isdigit() else (names.index(text) + 1 if text in names else None)
    try:
        return enum_cls(number)
    except ValueError:
        raise ValueError(f"{what} must be one of {names}, got {value!r}.") from None


def _current_device() -> torch.device:
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


@dataclass
class FullyShardedDataParallelPlugin:
    """Options of Fully Sharded Data Parallel; the meaning of each is Accelerate's (see docs/planned-features.md).

    fsdp_version: 1 (``FullyShardedDataParallel``) or 2 (``fully_shard``); default 1.
    sharding_strategy (v1, deprecated for ``reshard_after_forward``), reshard_after_forward (a bool in v2, a
    sharding strategy name in v1), backward_prefetch ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"; v1 only),
    mixed_precision_policy ("fp8", "fp16", "bf16", "fp32", a dict of dtypes or the torch policy object),
    auto_wrap_policy ("transformer_based_wrap", "size_based_wrap", "no_wrap" or a callable), cpu_offload,
    ignored_modules (modules or a regex of names), state_dict_type ("FULL_STATE_DICT", "LOCAL_STATE_DICT",
    "SHARDED_STATE_DICT"), limit_all_gathers, use_orig_params / sync_module_states / forward_prefetch (v1 only),
    activation_checkpointing (+ _offload, v2), cpu_ram_efficient_loading, transformer_cls_names_to_wrap,
    min_num_params.
    """

    fsdp_version: int = None
    sharding_strategy: Union[str, Any] = None
    reshard_after_forward: Union[str, Any, bool] = None
    backward_prefetch: Optional[Union[str, Any]] = None
    mixed_precision_policy: Optional[Union[dict, str, Any]] = None
    auto_wrap_policy: Optional[Union[Callable, str]] = None
    cpu_offload: Union[bool, Any] = None
    ignored_modules: Optional[Any] = None
    state_dict_type: Union[str, Any] = None
    state_dict_config: Optional[Any] = None
    optim_state_dict_config: Optional[Any] = None
    limit_all_gathers: bool = True
    use_orig_params: Optional[bool] = None
    param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None
    sync_module_states: Optional[bool] = None
    forward_prefetch: bool = None
    activation_checkpointing: bool = None
    activation_checkpointing_offload: bool = None
    cpu_ram_efficient_loading: bool = None
    transformer_cls_names_to_wrap: Optional[list[str]] = None
    min_num_params: Optional[int] = None

    def _env(self, field: str, default, parse):
        return from_env("FullyShardedDataParallelPlugin", field, getattr(self, field), default, parse,
                        setting=field if field.startswith("fsdp_") else f"fsdp_{field}")

    def _flag(self, field: str, setting: Optional[str] = None) -> bool:
        what = f"FullyShardedDataParallelPlugin.{field}"
        return from_env("FullyShardedDataParallelPlugin", field, getattr(self, field), False, as_bool(what),
                        setting=f"fsdp_{setting or field}")

    def __post_init__(self):
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

        notes = set()
        self.fsdp_version = self._env("fsdp_version", 1, as_int("FullyShardedDataParallelPlugin.fsdp_version",
                                                                choices=(1, 2)))
        v1, v2 = self.fsdp_version == 1, self.fsdp_version == 2

        def strategy(field):
            return lambda value: _to_torch_enum(ShardingStrategy, value, FSDP_SHARDING_STRATEGY,
                                                f"FullyShardedDataParallelPlugin.{field}")

        if self.sharding_strategy is not None:
            notes.add("sharding_strategy is deprecated in favour of reshard_after_forward.")
        if v1:
            self.sharding_strategy = self._env("sharding_strategy", ShardingStrategy.FULL_SHARD,
                                               strategy("sharding_strategy"))
        if self.reshard_after_forward is None and self.sharding_strategy is None:  # FSDP2
            self.reshard_after_forward = self._env(
                "reshard_after_forward", True, as_bool("FullyShardedDataParallelPlugin.reshard_after_forward"))
        elif isinstance(self.reshard_after_forward, str):
            parse = (as_bool("FullyShardedDataParallelPlugin.reshard_after_forward") if v2
                     else strategy("reshard_after_forward"))
            self.reshard_after_forward = parse(self.reshard_after_forward)
        if v2 and self.sharding_strategy is not None and self.reshard_after_forward is None:
            raise ValueError(
                f"sharding_strategy={self.sharding_strategy!r} is FSDP1's option and fsdp_version=2 was asked for: "
                "give reshard_after_forward instead (True shards parameters again after forward, like FULL_SHARD; "
                "False keeps them gathered until backward, like SHARD_GRAD_OP), or use fsdp_version=1.")
        if v2 and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward={self.reshard_after_forward!r} is not supported with FSDP2: "
                             "set it to True or False.")
        if v1 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward={self.reshard_after_forward!r} is not supported with FSDP1: "
                             f"set it to a sharding strategy, one of {FSDP_SHARDING_STRATEGY}.")

        self.cpu_offload = self._flag("cpu_offload", "offload_params") if (
            self.cpu_offload is None or isinstance(self.cpu_offload, (bool, str))) else self.cpu_offload
        self.set_cpu_offload()
        self.validate_cpu_offload()

        def prefetch(value):
            if isinstance(value, str) and value.strip().upper() == "NO_PREFETCH":
                return None
            return _to_torch_enum(BackwardPrefetch, value, FSDP_BACKWARD_PREFETCH,
                                  "FullyShardedDataParallelPlugin.backward_prefetch")

        self.backward_prefetch = self._env("backward_prefetch", None, prefetch)
        if v2 and self.backward_prefetch is not None:
            notes.add("backward_prefetch is not supported in FSDP2. Setting backward prefetch to None. FSDP2 prefetches "
                      "by itself.")
            self.backward_prefetch = None

        self.set_state_dict_type()
        self._resolve_auto_wrap_policy()

        for field in ("use_orig_params", "sync_module_states"):
            if v1:
                setattr(self, field, self._flag(field))
            elif getattr(self, field) is not None:
                notes.add(f"{field} is obsolete in FSDP2; it is set to None.")
                setattr(self, field, None)
        if v1:
            self.forward_prefetch = self._flag("forward_prefetch")
        elif self.forward_prefetch is not None:
            raise ValueError("forward_prefetch is not yet implemented in FSDP2: leave it unset (None) or use "
                             "fsdp_version=1.")

        self.activation_checkpointing = self._flag("activation_checkpointing")
        self.activation_checkpointing_offload = self._flag("activation_checkpointing_offload")
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError("activation_checkpointing_offload=True requires activation_checkpointing=True.")
        if self.activation_checkpointing_offload and not v2:
            raise ValueError("activation_checkpointing_offload=True requires fsdp_version=2.")

        self.ignored_modules = self._env("ignored_modules", None, lambda value: value)
        if isinstance(self.ignored_modules, str):
            try:
                re.compile(self.ignored_modules)
            except re.error as error:
                raise ValueError(f"FullyShardedDataParallelPlugin.ignored_modules={self.ignored_modules!r} is not "
                                 f"a valid regular expression: {error}.") from None
        self.cpu_ram_efficient_loading = self._flag("cpu_ram_efficient_loading")
        if v1 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            warnings.warn("cpu_ram_efficient_loading needs sync_module_states: it is set to True.")
            self.sync_module_states = True

        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()

        if self.sync_module_states and self.param_init_fn is None:
            device = _current_device()
            self.param_init_fn = lambda module: module.to_empty(device=device, recurse=False)
        if notes:
            logger.warning("FullyShardedDataParallelPlugin (FSDP2):\n" + "\n".join(sorted(notes)))

    def _resolve_auto_wrap_policy(self):
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        def parse(value):
            if callable(value):
                return value
            if str(value).strip().upper() not in FSDP_AUTO_WRAP_POLICY:
                raise ValueError(f"FullyShardedDataParallelPlugin.auto_wrap_policy must be a callable or one of "
                                 f"{FSDP_AUTO_WRAP_POLICY}, got {value!r}.")
            return str(value).strip().upper()

        policy = self.auto_wrap_policy = self._env("auto_wrap_policy", "NO_WRAP", parse)
        if callable(policy):
            return
        if policy == "TRANSFORMER_BASED_WRAP":
            self.auto_wrap_policy = transformer_auto_wrap_policy
            names = from_env("FullyShardedDataParallelPlugin", "transformer_cls_names_to_wrap",
                             self.transformer_cls_names_to_wrap, None, lambda value: value,
                             setting="fsdp_transformer_cls_to_wrap")
            self.transformer_cls_names_to_wrap = names.split(",") if isinstance(names, str) else names
        elif policy == "SIZE_BASED_WRAP":
            self.auto_wrap_policy = size_based_auto_wrap_policy
            self.min_num_params = self._env("min_num_params", 0,
                                            as_int("FullyShardedDataParallelPlugin.min_num_params", minimum=0))
        else:
            self.auto_wrap_policy = None

    def set_state_dict_type(self, state_dict_type: Optional[Union[str, StateDictType]] = None) -> None:
        """Set ``state_dict_type`` (or resolve it) and the state dict configs that go with it."""
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
            StateDictType,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        self.state_dict_type = self._env(
            "state_dict_type", StateDictType.FULL_STATE_DICT if self.fsdp_version == 1
            else StateDictType.SHARDED_STATE_DICT,
            lambda value: _to_torch_enum(StateDictType, value, FSDP_STATE_DICT_TYPE,
                                         "FullyShardedDataParallelPlugin.state_dict_type"))
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError("FSDP2 has no LOCAL_STATE_DICT: use SHARDED_STATE_DICT or FULL_STATE_DICT.")

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Bind the wrap policy to ``model``: its transformer layer classes, or ``min_num_params``."""
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy == transformer_auto_wrap_policy:
            if self.transformer_cls_names_to_wrap is None:
                self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", None) or [])
            classes = layer_classes(model, self.transformer_cls_names_to_wrap)
            self.auto_wrap_policy = functools.partial(self.auto_wrap_policy, transformer_layer_cls=classes)
        elif self.auto_wrap_policy == size_based_auto_wrap_policy:
            self.auto_wrap_policy = (functools.partial(self.auto_wrap_policy, min_num_params=self.min_num_params)
                                     if self.min_num_params > 0 else None)

    def set_mixed_precision(self, mixed_precision: Union[str, torch.dtype, dict[str, torch.dtype]],
                            buffer_autocast: bool = False, override: bool = False) -> None:
        """Set the mixed precision policy from a name ("bf16" ...), a dtype, or a dict of dtypes."""
        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = _MIXED_PRECISION_DTYPES.get(mixed_precision)
            if dtype is None:
                raise ValueError(f"Invalid mixed precision {mixed_precision!r}: choose one of "
                                 f"{list(_MIXED_PRECISION_DTYPES)}.")
        elif isinstance(mixed_precision, torch.dtype) and mixed_precision not in _MIXED_PRECISION_DTYPES.values():
            raise ValueError(f"Invalid mixed precision {mixed_precision}: choose one of {_DTYPE_NAMES}.")
        policy_class = self._mixed_precision_class()
        if override or self.mixed_precision_policy is None:
            dtypes = {"param_dtype": dtype, "reduce_dtype": dtype}
            if self.fsdp_version == 1:
                dtypes["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
            else:
                dtypes["output_dtype"] = dtype
            self.mixed_precision_policy = policy_class(**dtypes)
        elif isinstance(self.mixed_precision_policy, dict):
            keys = ["param_dtype", "reduce_dtype"] + (["buffer_dtype"] if self.fsdp_version == 1 else ["output_dtype"])
            missing = [k for k in keys if k not in self.mixed_precision_policy]
            invalid = [k for k, v in self.mixed_precision_policy.items() if v not in _MIXED_PRECISION_DTYPES.values()]
            if missing or invalid:
                raise ValueError(f"Invalid mixed_precision_policy {self.mixed_precision_policy}: it needs the keys "
                                 f"{keys}, each a dtype among {_DTYPE_NAMES}.")
            self.mixed_precision_policy = policy_class(**self.mixed_precision_policy)

    def _mixed_precision_class(self):
        from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

        return MixedPrecisionPolicy if self.fsdp_version == 2 else MixedPrecision

    def validate_mixed_precision_policy(self) -> None:
        """The policy must be torch's ``MixedPrecisionPolicy`` (FSDP2) or ``MixedPrecision`` (FSDP1)."""
        policy_class = self._mixed_precision_class()
        if not isinstance(self.mixed_precision_policy, policy_class):
            raise ValueError(f"mixed_precision_policy must be a torch.distributed.fsdp.{policy_class.__name__} "
                             f"with fsdp_version={self.fsdp_version}, got {self.mixed_precision_policy!r}.")

    def set_cpu_offload(self) -> None:
        """Turn a boolean ``cpu_offload`` into torch's object (``CPUOffload`` in FSDP1, an offload policy in FSDP2)."""
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        if isinstance(self.cpu_offload, bool):
            if self.fsdp_version == 2:
                self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
            else:
                self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """``cpu_offload`` must be an ``OffloadPolicy`` (FSDP2) or a ``CPUOffload`` (FSDP1)."""
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        expected = OffloadPolicy if self.fsdp_version == 2 else CPUOffload
        if not isinstance(self.cpu_offload, expected):
            raise ValueError(f"cpu_offload must be a bool or a torch.distributed.fsdp.{expected.__name__} with "
                             f"fsdp_version={self.fsdp_version}, got {self.cpu_offload!r}.")


def layer_classes(model: torch.nn.Module, names: Iterable[str]) -> set[type[torch.nn.Module]]:
    """The module classes of ``model`` named ``names`` (transformer layers to wrap); a name no module of the model
    has is refused, in the reference's words, with the class names the model does have."""
    classes = set()
    for name in names:
        layer_class = get_module_class_from_name(model, name)
        if layer_class is None:
            present = sorted({type(module).__name__ for module in model.modules()})
            raise ValueError(f"Could not find the transformer layer class {name} in the model. Its module classes "
                             f"are: {', '.join(present)}.")
        classes.add(layer_class)
    return classes
