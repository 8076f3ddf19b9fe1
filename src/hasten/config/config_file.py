"""The config file: where it lives, writing a basic one, and reading one (hasten's or Accelerate's).

The default file is ``default_config.yaml`` in ``$HASTEN_CONFIG_HOME`` when that is set, else in
``${XDG_CACHE_HOME:-~/.cache}/hasten``. The format is Accelerate's (YAML or JSON, same keys), so an
Accelerate ``default_config.yaml`` can be used as is. See docs/config-file.md.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import yaml

from ..core.env_aliases import get_setting
from .booleans import ACCEPTED_WORDS, parse_bool
from .enums import ComputeEnvironment, DistributedType, DynamoBackend, PrecisionType

__all__ = ["default_config_file", "default_config_path", "write_basic_config", "load_config_file",
           "normalize_config", "CONFIG_HOME_ENV", "CONFIG_FILE_NAME", "PARALLELISM_KEYS"]

logger = logging.getLogger(__name__)

CONFIG_HOME_ENV = "HASTEN_CONFIG_HOME"
CONFIG_FILE_NAME = "default_config.yaml"


def default_config_path() -> str:
    """The default config file, computed now from the environment (``HASTEN_CONFIG_HOME``, ``XDG_CACHE_HOME``)."""
    folder = get_setting(CONFIG_HOME_ENV)  # or ACCELERATE_CONFIG_HOME, like every HASTEN_* variable
    if not folder:
        folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "hasten")
    return os.path.join(os.path.expanduser(folder), CONFIG_FILE_NAME)


# Accelerate's name, computed at import. Code that must honour later changes of the environment calls
# default_config_path() instead; write_basic_config() does so when given this default.
default_config_file = default_config_path()


# ----------------------------------------------------------------------------- writing
def _local_devices() -> tuple:
    """``(distributed_type, num_processes, use_cpu)`` for the accelerators of this machine."""
    import torch

    multi_types = {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU,
                   "npu": DistributedType.MULTI_NPU, "mlu": DistributedType.MULTI_MLU,
                   "musa": DistributedType.MULTI_MUSA, "sdaa": DistributedType.MULTI_SDAA,
                   "hpu": DistributedType.MULTI_HPU}
    for name, multi_type in multi_types.items():
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "is_available") and module.is_available():
            count = module.device_count()
            return (multi_type if count > 1 else DistributedType.NO), count, False
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return DistributedType.NO, 1, False
    return DistributedType.NO, 1, True


def _basic_config(mixed_precision: str) -> dict:
    distributed_type, num_processes, use_cpu = _local_devices()
    return {
        "compute_environment": ComputeEnvironment.LOCAL_MACHINE.value,
        "debug": False,
        "distributed_type": distributed_type.value,
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": False,
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": use_cpu,
    }


def write_basic_config(mixed_precision: str = "no",
                       save_location: Union[str, os.PathLike] = default_config_file) -> Union[Path, Literal[False]]:
    """Write a config for this machine (all its GPUs, or the CPU) and return its path.

    ``mixed_precision`` is one of ``no``, ``fp16``, ``bf16``, ``fp8``. An existing file is never
    overwritten: it is left as it is, a message says so (delete the file to write a new one), and the
    function returns ``False``. The default ``save_location`` is ``default_config_path()`` at call time.
    """
    precision = PrecisionType.parse(mixed_precision, "mixed_precision").value
    if save_location is default_config_file:
        save_location = default_config_path()
    path = Path(save_location).expanduser()
    if path.exists():
        logger.warning(
            "A config file already exists at %s and was left unchanged. To write a new one, delete it "
            "(rm %s) or pass another save_location.", path, path
        )
        return False
    text = yaml.safe_dump(_basic_config(precision), sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x", encoding="utf-8") as handle:  # "x": never replace a file created meanwhile
            handle.write(text)
    except FileExistsError:
        logger.warning("A config file appeared at %s meanwhile and was left unchanged.", path)
        return False
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------- reading
class _Invalid(ValueError):
    """A value that does not fit its key; the caller adds the file and key."""


def _integer(minimum: int, maximum: Optional[int] = None) -> Callable:
    def check(value):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer, got {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise _Invalid(f"expected an integer {bounds}, got {value}")
        return value

    return check


def _num_processes(value):
    if value == -1 and not isinstance(value, bool):
        return None  # Accelerate writes -1 for "decided at launch"
    return _integer(1)(value)


def _boolean(value):
    try:
        return parse_bool(value, "the value")
    except (TypeError, ValueError):
        raise _Invalid(f"expected true or false (or {ACCEPTED_WORDS}), got {value!r}") from None


def _text(value):
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise _Invalid(f"expected a string, got {value!r}")


def _text_list(value):
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise _Invalid(f"expected a list of strings, got {value!r}")


def _mapping(value):
    if isinstance(value, dict):
        return value
    raise _Invalid(f"expected a mapping (key: value entries), got {value!r}")


def _enum(enum, what: str) -> Callable:
    def check(value):
        try:
            return enum.parse(value, what).value
        except ValueError as error:
            raise _Invalid(str(error)) from None

    return check


def _mixed_precision(value):
    if value is False:  # YAML 1.1 reads an unquoted `no` as false
        return PrecisionType.NO.value
    return _enum(PrecisionType, "mixed_precision")(value)


_SAGEMAKER_DISTRIBUTED_TYPES = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")


def _distributed_type(value, config: dict):
    if value is False:  # YAML 1.1 reads an unquoted `NO` as false
        value = "NO"
    if config.get("compute_environment") == ComputeEnvironment.AMAZON_SAGEMAKER.value:
        text = str(value).upper()
        if text not in _SAGEMAKER_DISTRIBUTED_TYPES:
            choices = ", ".join(_SAGEMAKER_DISTRIBUTED_TYPES)
            raise _Invalid(f"on Amazon SageMaker choose one of {choices}; got {value!r}")
        return text
    return _enum(DistributedType, "distributed_type")(value)


# dynamo_config's keys, as Accelerate writes them (``dynamo_`` prefix) and as they may be written without it
DYNAMO_KEYS = ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
               "dynamo_use_regional_compilation")
_DYNAMO_ALL_KEYS = DYNAMO_KEYS + tuple(key[len("dynamo_"):] for key in DYNAMO_KEYS)


def _unknown_keys_message(unknown, known) -> str:
    """``unknown keys 'mixed_precison' (did you mean 'mixed_precision'?), 'my_setting'``."""
    described = []
    for key in sorted(unknown, key=str):
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        described.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return f"unknown key{'s' if len(described) > 1 else ''} {', '.join(described)}"


def _dynamo_config(value):
    value = dict(_mapping(value))
    unknown = [key for key in value if key not in _DYNAMO_ALL_KEYS]
    if unknown:
        raise _Invalid(_unknown_keys_message(unknown, DYNAMO_KEYS) + "; the keys are "
                       + ", ".join(DYNAMO_KEYS))
    if value.get("dynamo_backend") is not None:
        value["dynamo_backend"] = _enum(DynamoBackend, "dynamo_backend")(value["dynamo_backend"])
    return value


def _one_of(*choices: str) -> Callable:
    def check(value):
        text = str(value).strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise _Invalid(f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return text

    return check


# parallelism_config's keys, as Accelerate writes them (``parallelism_config_`` prefix; also read without it)
PARALLELISM_PREFIX = "parallelism_config_"
PARALLELISM_KEYS: dict = {PARALLELISM_PREFIX + key: check for key, check in (
    ("dp_replicate_size", _integer(1)), ("dp_shard_size", _integer(1)), ("tp_size", _integer(1)),
    ("cp_size", _integer(1)), ("cp_backend", _one_of("torch")), ("cp_comm_strategy", _one_of("allgather", "alltoall")),
    ("sp_size", _integer(1)), ("sp_backend", _one_of("deepspeed")), ("sp_seq_length", _integer(1)),
    ("sp_seq_length_is_variable", _boolean), ("sp_attn_implementation", _text), ("pp_size", _integer(1)))}


def _parallelism_config(value):
    """The ``parallelism_config`` section, keys with their ``parallelism_config_`` prefix, values checked."""
    result = {}
    for key, item in _mapping(value).items():
        full = key if str(key).startswith(PARALLELISM_PREFIX) else PARALLELISM_PREFIX + str(key)
        if full not in PARALLELISM_KEYS:
            raise _Invalid(_unknown_keys_message([key], list(PARALLELISM_KEYS)) + "; the keys are "
                           + ", ".join(PARALLELISM_KEYS))
        if full in result:
            raise _Invalid(f"{full!r} is given twice (with and without the {PARALLELISM_PREFIX!r} prefix)")
        if item is None:
            continue
        try:
            result[full] = PARALLELISM_KEYS[full](item)
        except _Invalid as error:
            raise _Invalid(f"{full}: {error}") from None
    return result


# Every key of Accelerate's cluster and SageMaker configs, with its check. Checks return the normalised value.
KNOWN_KEYS: dict = {
    "compute_environment": _enum(ComputeEnvironment, "compute_environment"),
    "distributed_type": None,  # depends on compute_environment, see _distributed_type
    "mixed_precision": _mixed_precision,
    "use_cpu": _boolean,
    "debug": _boolean,
    "num_processes": _num_processes,
    "num_machines": _integer(1),
    "machine_rank": _integer(0),
    "gpu_ids": _text,
    "main_process_ip": _text,
    "main_process_port": _integer(1, 65535),
    "rdzv_backend": _text,
    "same_network": _boolean,
    "main_training_function": _text,
    "enable_cpu_affinity": _boolean,
    "gradient_accumulation_steps": _integer(1),
    "downcast_bf16": _boolean,
    "dynamo_config": _dynamo_config,
    "fp8_config": _mapping,
    "deepspeed_config": _mapping,
    "fsdp_config": _mapping,
    "parallelism_config": _parallelism_config,
    "megatron_lm_config": _mapping,
    "mpirun_config": _mapping,
    "tpu_name": _text,
    "tpu_zone": _text,
    "tpu_use_cluster": _boolean,
    "tpu_use_sudo": _boolean,
    "command_file": _text,
    "commands": _text_list,
    "tpu_vm": _text_list,
    "tpu_env": _text_list,
    # Amazon SageMaker
    "ec2_instance_type": _text,
    "iam_role_name": _text,
    "image_uri": _text,
    "profile": _text,
    "region": _text,
    "base_job_name": _text,
    "pytorch_version": _text,
    "transformers_version": _text,
    "py_version": _text,
    "sagemaker_inputs_file": _text,
    "sagemaker_metrics_file": _text,
    "additional_args": _mapping,
}


def _upgrade_legacy_keys(raw: dict) -> dict:
    """Old Accelerate files used ``fp16: true`` and a top-level ``dynamo_backend``; turn them into today's keys."""
    config = dict(raw)
    if "fp16" in config:
        fp16 = config.pop("fp16")
        if config.get("mixed_precision") is None and fp16 is not None and _boolean(fp16):
            config["mixed_precision"] = "fp16"
    if "dynamo_backend" in config:
        backend = config.pop("dynamo_backend")
        if config.get("dynamo_config") is None:
            config["dynamo_config"] = {} if str(backend).upper() == "NO" else {"dynamo_backend": backend}
    return config


def normalize_config(raw: dict, source: str = "<config>") -> dict:
    """Check and normalise a config mapping read from ``source`` (see ``load_config_file``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"Config file {source} must contain a mapping of keys to values, got {type(raw).__name__}.")
    bad_keys = [key for key in raw if not isinstance(key, str)]
    if bad_keys:
        raise ValueError(f"Config file {source}: keys must be strings, got {bad_keys}.")
    try:
        config = _upgrade_legacy_keys(raw)
    except _Invalid as error:
        raise ValueError(f"Config file {source}, key 'fp16': {str(error).rstrip('.')}.") from None
    unknown = [key for key in config if key not in KNOWN_KEYS]
    if unknown:
        raise ValueError(f"Config file {source}: {_unknown_keys_message(unknown, list(KNOWN_KEYS))}. Fix or remove "
                         "them (docs/config-file.md lists every key).")
    result = {}
    # compute_environment first: distributed_type's valid values depend on it.
    for key in sorted(config, key=lambda k: k != "compute_environment"):
        value = config[key]
        if value is None:
            continue  # "not set": the launcher's default applies
        try:
            result[key] = _distributed_type(value, result) if key == "distributed_type" else KNOWN_KEYS[key](value)
        except _Invalid as error:
            raise ValueError(f"Config file {source}, key {key!r}: {str(error).rstrip('.')}.") from None
        if result[key] is None:
            del result[key]
    if result.get("machine_rank", 0) >= result.get("num_machines", 1):
        raise ValueError(
            f"Config file {source}: machine_rank {result.get('machine_rank', 0)} must be smaller than num_machines "
            f"{result.get('num_machines', 1)} (ranks count from 0)."
        )
    return {key: result[key] for key in config if key in result}


def load_config_file(path: Union[str, os.PathLike]) -> dict[str, Any]:
    """Read a YAML or JSON config file (hasten's or Accelerate's) and return its settings, checked.

    Only the keys present in the file are returned (a missing key means "use the default"; ``null`` too).
    Values are normalised: enums as their canonical strings (``"MULTI_GPU"``, ``"bf16"``), integers as
    ints, booleans as bools; old Accelerate keys (``fp16: true``, ``dynamo_backend``) are upgraded. A bad
    ``distributed_type``, ``mixed_precision``, ``num_processes`` ... raises ``ValueError`` naming the file and
    the key; so do unknown keys, all listed at once with the closest known key for each typo.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"Config file {path} does not exist. Write one with `hasten config` (or hasten.utils."
            "write_basic_config()), or pass the path of an existing file."
        )
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"Config file {path} cannot be parsed: {error}") from None
    if raw is None:  # an empty file, or one with only comments: most likely a write that went wrong
        raise ValueError(
            f"Config file {path} is empty (no settings, only comments or blank lines). Write the settings in it "
            "(e.g. `mixed_precision: bf16`), regenerate it with `hasten config`, or delete it to use the defaults."
        )
    return normalize_config(raw, source=str(path))
