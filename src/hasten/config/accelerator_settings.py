"""Resolving the ``Accelerator``'s settings, in one place, with the one precedence rule.

argument in code > launcher environment (``HASTEN_*``, or Accelerate's ``ACCELERATE_*`` aliases) > config file
(the one ``hasten launch`` used, named in ``HASTEN_CONFIG_FILE``) > default. Two explicit sources that disagree
raise ``ConfigConflictError``. A file named there without the launcher (a pod's ``python train.py``) gives its
precision, CPU choice, accumulation steps and dynamo backend (read here) and its backend, parallelism and fp8
sections (read by the plugins through ``config/launch_file.py``), as ``hasten launch --config_file`` would.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

from ..core.env_aliases import get_setting, setting_is_set
from .accumulation import GradientAccumulationPlugin
from .booleans import parse_bool
from .dynamo import TorchDynamoPlugin
from .enums import PrecisionType, RNGType
from .env_fields import as_bool
from .fp8 import check_fp8_recipe
from .kwargs import KwargsHandler
from .launch_file import read_launch_setting, unlaunched_file_variables
from .launch_groups import BACKEND_SWITCH_OF
from .project import ProjectConfiguration
from .resolution import resolve

if TYPE_CHECKING:
    from .data import DataLoaderConfiguration
    from .enums import DynamoBackend

__all__ = ["AcceleratorSettings", "BACKEND_SWITCHES", "BACKEND_SWITCH_OF", "launcher_switches",
           "resolve_accelerator_settings", "resolve_mixed_precision", "SPLIT_BATCHES_UNSET"]

SPLIT_BATCHES_UNSET = object()  # the deprecated ``split_batches`` argument was not passed


@dataclass
class AcceleratorSettings:
    """Every setting of a run, resolved once by the Accelerator and handed to the rooms that need them (the
    strategy reads ``mixed_precision`` and ``handlers`` here, not from the process-wide state)."""

    mixed_precision: str = PrecisionType.NO.value
    cpu: bool = False
    gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None
    dynamo_plugin: Optional[TorchDynamoPlugin] = None
    dataloader_config: object = None
    project_config: Optional[ProjectConfiguration] = None
    rng_types: list = field(default_factory=list)
    handlers: dict = field(default_factory=dict)
    #: the backends the launcher selected (``use_fsdp``, ``use_deepspeed``, ``use_megatron_lm``: its ``--use_*``
    #: flags or a config file's ``distributed_type``), read once from its environment
    launcher_switches: frozenset = frozenset()


#: the launcher's backend switches (HASTEN_USE_<NAME>, or Accelerate's ACCELERATE_USE_<NAME>)
BACKEND_SWITCHES = ("use_fsdp", "use_deepspeed", "use_megatron_lm")


def launcher_switches() -> frozenset:
    """The backend switches (``BACKEND_SWITCHES``) the launcher's environment turns on, or a config file given without
    the launcher (``config/launch_file.py``)."""
    return frozenset(switch for switch in BACKEND_SWITCHES if read_launch_setting(switch, as_bool(switch))[0])


# config-file key -> (HASTEN_ setting the launcher exports it as, the value that means "not given")
_CONFIG_SETTINGS = {"mixed_precision": ("mixed_precision", "no"), "use_cpu": ("use_cpu", False),
                    "gradient_accumulation_steps": ("gradient_accumulation_steps", 1)}


def _launcher_config() -> tuple[dict, Optional[str]]:
    """The settings of the config file named by ``HASTEN_CONFIG_FILE`` that still count.

    ``hasten launch`` already merged the file with its flags into ``HASTEN_*`` variables: where such a variable
    is set, it is the launcher's word and the file's value is not compared again. A value equal to the default
    (``write_basic_config`` writes ``mixed_precision: no``) counts as not given.
    """
    path = get_setting("config_file")
    if not path:
        return {}, None
    from .config_file import load_config_file

    raw = load_config_file(path)
    config = {}
    for key, (setting, neutral) in _CONFIG_SETTINGS.items():
        if key in raw and not setting_is_set(setting) and raw[key] != neutral:
            config[key] = raw[key]
    sections = unlaunched_file_variables()  # deepspeed_config's gradient_accumulation_steps, as the launcher exports it
    for key, (setting, _) in _CONFIG_SETTINGS.items():
        if key not in config and sections is not None and sections.get(setting) is not None:
            config[key] = sections.get(setting)
    backend = (raw.get("dynamo_config") or {}).get("dynamo_backend")
    if backend is not None and not setting_is_set("dynamo_backend") and str(backend).upper() != "NO":
        config["dynamo_backend"] = backend
    return config, path


def resolve_mixed_precision(value: Optional[str] = None, argument_name: str = "mixed_precision=",
                            config: Optional[dict] = None, config_path: Optional[str] = None) -> str:
    """``mixed_precision`` by the one precedence rule: argument > launcher environment > config file > ``"no"``."""
    precision, _ = resolve("mixed_precision", value, argument_name=argument_name, config=config or {},
                           config_path=config_path, default=PrecisionType.NO.value,
                           parse=lambda v: PrecisionType.parse(v, "mixed_precision").value)
    return precision


def _positive_int(what: str):
    def parse(value):
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be an int >= 1, got {value!r}.") from None
        if number < 1 or isinstance(value, bool) or (isinstance(value, float) and value != number):
            raise ValueError(f"{what} must be an int >= 1, got {value!r}.")
        return number

    return parse


def _handlers_by_type(kwargs_handlers) -> dict:
    handlers = {}
    for handler in kwargs_handlers or []:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(f"kwargs_handlers takes KwargsHandler instances (DistributedDataParallelKwargs, "
                            f"GradScalerKwargs, ...), got {type(handler).__name__}.")
        if type(handler) in handlers:
            raise ValueError(f"kwargs_handlers contains two {type(handler).__name__}; pass each kind once.")
        handlers[type(handler)] = handler
    return handlers


def _rng_types(rng_types) -> list:
    if rng_types is None:
        return [RNGType.GENERATOR.value]
    return [RNGType.parse(r, "rng type").value for r in rng_types]


def _dataloader_config(dataloader_config, split_batches):
    from .data import DataLoaderConfiguration

    if dataloader_config is None:
        dataloader_config = DataLoaderConfiguration()
    elif not isinstance(dataloader_config, DataLoaderConfiguration):
        raise TypeError(f"dataloader_config must be a DataLoaderConfiguration, got {type(dataloader_config).__name__}.")
    if split_batches is not SPLIT_BATCHES_UNSET:
        split_batches = parse_bool(split_batches, "Accelerator(split_batches=...)")
        warnings.warn("Accelerator(split_batches=...) is deprecated: pass "
                      "dataloader_config=DataLoaderConfiguration(split_batches=...) instead.", FutureWarning,
                      stacklevel=4)
        if dataloader_config.split_batches not in (False, split_batches):
            raise ValueError("split_batches was given both to Accelerator(...) and in dataloader_config, with "
                             "different values; keep only dataloader_config.split_batches.")
        dataloader_config.split_batches = split_batches
    return dataloader_config


def resolve_accelerator_settings(*, mixed_precision: Optional[str] = None, cpu: bool = False,
                                 gradient_accumulation_steps: int = 1,
                                 gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None,
                                 dynamo_backend: Optional[Union[DynamoBackend, str]] = None,
                                 dynamo_plugin: Optional[TorchDynamoPlugin] = None,
                                 dataloader_config: Optional[DataLoaderConfiguration] = None,
                                 split_batches: bool = SPLIT_BATCHES_UNSET,
                                 project_dir: Optional[Union[str, os.PathLike]] = None,
                                 project_config: Optional[ProjectConfiguration] = None,
                                 rng_types: Optional[list[Union[str, RNGType]]] = None,
                                 kwargs_handlers: Optional[list[KwargsHandler]] = None) -> AcceleratorSettings:
    """Validate the Accelerator's arguments and merge them with the launcher's environment and config file."""
    cpu = parse_bool(cpu, "Accelerator(cpu=...)")
    if split_batches is not SPLIT_BATCHES_UNSET:
        parse_bool(split_batches, "Accelerator(split_batches=...)")  # checked before anything else is read
    config, config_path = _launcher_config()
    handlers = _handlers_by_type(kwargs_handlers)

    precision = resolve_mixed_precision(mixed_precision, "Accelerator(mixed_precision=...)", config, config_path)
    check_fp8_recipe(precision, handlers)  # a recipe without fp8, or of a library hasten does not run yet

    if gradient_accumulation_plugin is not None:
        if gradient_accumulation_steps != 1:
            raise ValueError("Pass gradient_accumulation_steps or gradient_accumulation_plugin, not both: set "
                             "GradientAccumulationPlugin(num_steps=...) instead.")
        if not isinstance(gradient_accumulation_plugin, GradientAccumulationPlugin):
            raise TypeError("gradient_accumulation_plugin must be a GradientAccumulationPlugin.")
        if gradient_accumulation_plugin.num_steps is None:
            gradient_accumulation_plugin.num_steps = 1
    else:
        argument = _positive_int("gradient_accumulation_steps")(gradient_accumulation_steps)
        steps, _ = resolve("gradient_accumulation_steps", argument if argument != 1 else None,
                           argument_name="Accelerator(gradient_accumulation_steps=...)", config=config,
                           config_path=config_path, default=1, parse=_positive_int("gradient_accumulation_steps"))
        gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)

    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("Pass dynamo_backend or dynamo_plugin, not both: set TorchDynamoPlugin(backend=...).")
    if dynamo_plugin is None:
        backend = dynamo_backend
        if backend is None:
            backend = config.get("dynamo_backend")
        dynamo_plugin = TorchDynamoPlugin(backend=backend)

    use_cpu = cpu or bool(config.get("use_cpu", False))

    if project_config is None:
        project_config = ProjectConfiguration(project_dir=project_dir)
    elif project_dir is not None:
        if project_config.project_dir not in (None, os.fspath(project_dir)):
            raise ValueError(f"project_dir={project_dir!r} contradicts project_config.project_dir="
                             f"{project_config.project_dir!r}; give it in one place.")
        project_config.set_directories(project_dir)

    return AcceleratorSettings(
        mixed_precision=precision, cpu=use_cpu, gradient_accumulation_plugin=gradient_accumulation_plugin,
        dynamo_plugin=dynamo_plugin, dataloader_config=_dataloader_config(dataloader_config, split_batches),
        project_config=project_config, rng_types=_rng_types(rng_types), handlers=handlers,
        launcher_switches=launcher_switches(),
    )
