"""Config files as objects: Accelerate's ``ClusterConfig`` / ``SageMakerConfig``, read and written by hasten.

Reading goes through ``hasten.config.config_file.load_config_file`` (the one reader: checked values, old keys
upgraded, unknown keys an error), so a file that ``hasten launch`` accepts is one these classes accept.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from enum import Enum
from typing import Optional, Union

import yaml

from ...config import config_file as _files
from ...config.enums import ComputeEnvironment, DistributedType
from ...core.constants import SAGEMAKER_PYTHON_VERSION, SAGEMAKER_PYTORCH_VERSION, SAGEMAKER_TRANSFORMERS_VERSION

__all__ = ["BaseConfig", "ClusterConfig", "SageMakerConfig", "load_config_from_file", "default_config_file",
           "default_yaml_config_file", "default_json_config_file", "cache_dir", "hf_cache_home"]

# Where Hugging Face tools keep their caches (Accelerate keeps its config there; hasten keeps its own apart).
hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
)
# hasten's config folder and default file (see hasten.config.config_file.default_config_path)
default_config_file = _files.default_config_file
default_yaml_config_file = default_config_file
cache_dir = os.path.dirname(default_config_file)
default_json_config_file = os.path.join(cache_dir, "default_config.json")


def load_config_from_file(config_file: Optional[Union[str, os.PathLike]]) -> Union[ClusterConfig, SageMakerConfig]:
    """The ``ClusterConfig`` (or ``SageMakerConfig``) of ``config_file``, or of the default file when None."""
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The config file {config_file} does not exist. Pass an existing file, or write one with "
            "`hasten config` (or `hasten config default`)."
        )
    path = config_file if config_file is not None else _files.default_config_path()
    settings = _files.load_config_file(path)
    sagemaker = settings.get("compute_environment") == ComputeEnvironment.AMAZON_SAGEMAKER.value
    return (SageMakerConfig if sagemaker else ClusterConfig)._from_settings(settings, path)


def _plain(value):
    """Enums as their values, empty mappings as None (not written), recursively."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()} or None
    return value


@dataclass
class BaseConfig:
    compute_environment: ComputeEnvironment
    distributed_type: Union[DistributedType, str]
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict:
        """The settings as plain values (enums as strings), without the unset ones."""
        result = {key: _plain(value) for key, value in vars(self).items()}
        return {key: value for key, value in result.items() if value is not None}

    @staticmethod
    def process_config(config_dict: dict) -> dict:
        """Fill what a file may leave out; ``distributed_type`` is required."""
        config_dict.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
        if "distributed_type" not in config_dict:
            raise ValueError("A config file must say its distributed_type (NO, MULTI_GPU, MULTI_CPU, ...).")
        if "num_processes" not in config_dict and config_dict["distributed_type"] in (DistributedType.NO, "NO"):
            config_dict["num_processes"] = 1
        upgraded = _files._upgrade_legacy_keys(config_dict)  # fp16: true, a top-level dynamo_backend
        config_dict.clear()
        config_dict.update(upgraded)
        config_dict.setdefault("mixed_precision", None)
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config_dict.setdefault(key, False)
        return config_dict

    @classmethod
    def _from_settings(cls, settings: dict, source) -> "BaseConfig":
        config = cls.process_config(dict(settings))
        known = {field.name for field in fields(cls)}
        if "num_processes" not in settings and "num_processes" not in known:  # the default only a cluster has
            config.pop("num_processes", None)
        extra = sorted(set(config) - known)
        if extra:
            raise ValueError(f"The config file {source} has keys a {cls.__name__} does not take: {extra}.")
        return cls(**config)

    @classmethod
    def from_json_file(cls, json_file: Optional[Union[str, os.PathLike]] = None) -> BaseConfig:
        return cls._from_settings(_files.load_config_file(json_file or default_json_config_file),
                                  json_file or default_json_config_file)

    def to_json_file(self, json_file: Union[str, os.PathLike]) -> None:
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls, yaml_file: Optional[Union[str, os.PathLike]] = None) -> BaseConfig:
        return cls._from_settings(_files.load_config_file(yaml_file or default_yaml_config_file),
                                  yaml_file or default_yaml_config_file)

    def to_yaml_file(self, yaml_file: Union[str, os.PathLike]) -> None:
        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def __post_init__(self):
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str) and self.compute_environment != ComputeEnvironment.AMAZON_SAGEMAKER:
            self.distributed_type = DistributedType(self.distributed_type)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}


@dataclass
class ClusterConfig(BaseConfig):
    """A config for machines you launch on yourself (``compute_environment: LOCAL_MACHINE``)."""

    num_processes: int = -1  # -1: decided at launch
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: Optional[str] = None
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None
    rdzv_backend: Optional[str] = "static"
    same_network: Optional[bool] = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: Optional[dict] = None
    deepspeed_config: Optional[dict] = None
    fsdp_config: Optional[dict] = None
    parallelism_config: Optional[dict] = None
    megatron_lm_config: Optional[dict] = None
    mpirun_config: Optional[dict] = None
    downcast_bf16: bool = False
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: Optional[str] = None
    commands: list = None
    tpu_vm: list = None
    tpu_env: list = None
    dynamo_config: Optional[dict] = None
    gradient_accumulation_steps: Optional[int] = None  # hasten: passed to the script like the other settings

    def __post_init__(self):
        for name in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config", "fp8_config",
                     "parallelism_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """A config for Amazon SageMaker (``compute_environment: AMAZON_SAGEMAKER``); hasten cannot launch it yet."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: Optional[str] = None
    profile: Optional[str] = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "hasten-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: Optional[str] = None
    sagemaker_metrics_file: Optional[str] = None
    additional_args: Optional[dict] = None
    dynamo_config: Optional[dict] = None
    enable_cpu_affinity: bool = False
