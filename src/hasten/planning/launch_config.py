"""A layout the plan chose, as an Accelerate-format config file that ``hasten launch --config_file`` (and
``accelerate launch`` on the reference library) runs unchanged.

The file says what the layout needs and nothing the launcher defaults well: the distributed type, the process and
machine counts, mixed precision and gradient accumulation, and the section of the backend (``fsdp_config``,
``deepspeed_config``, ``parallelism_config``) with the options the plan assumed (transformer-block wrapping,
resharding after the forward, offload, activation checkpointing, rank-0 loading; tensor parallelism with activation
checkpointing is written with an FSDP section, the one place a config file says it). It is checked by the config
reader ``hasten launch`` uses before it is written.
"""
from __future__ import annotations

import os
from typing import Any, Sequence, Union

from .layouts import Layout

__all__ = ["launch_config", "write_launch_config", "FSDP1_OPTIONS"]

#: the FSDP1 options a written config sets besides full sharding (FSDP1's default), as the plugin's fields (the file
#: prefixes each with ``fsdp_``); the planner traces FSDP1 with them (``Tracer.fsdp_plugin``)
FSDP1_OPTIONS = {"sync_module_states": True, "use_orig_params": True, "backward_prefetch": "BACKWARD_PRE"}


def _fsdp_section(layout: Layout, checkpointing: bool, blocks: Sequence[str]) -> dict[str, Any]:
    version = 1 if layout.family == "fsdp1" else 2
    wrap = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": ",".join(blocks)} if blocks else {"fsdp_auto_wrap_policy": "NO_WRAP"}
    section: dict[str, Any] = {
        "fsdp_version": version,
        **wrap,
        "fsdp_offload_params": layout.family == "fsdp2_offload",
        "fsdp_activation_checkpointing": checkpointing,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
    }
    if version == 2:
        section["fsdp_reshard_after_forward"] = True
    else:
        section["fsdp_sharding_strategy"] = "FULL_SHARD"
        section.update({f"fsdp_{name}": value for name, value in FSDP1_OPTIONS.items()})
    return section


def launch_config(layout: Layout, *, mixed_precision: str, gradient_accumulation_steps: int,
                  activation_checkpointing: bool, blocks: Sequence[str] = ()) -> dict[str, Any]:
    """The config file's mapping for ``layout`` (see the module docstring); ``blocks``: the class names of the
    model's repeated blocks, FSDP's units (none: the whole model one unit)."""
    distributed = {"single": "NO", "ddp": "MULTI_GPU", "tp": "MULTI_GPU", "zero": "DEEPSPEED"}.get(layout.family,
                                                                                                "FSDP")
    if layout.family == "tp" and activation_checkpointing:
        distributed = "FSDP"  # the FSDP section carries activation checkpointing; tensor parallelism applies it
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "num_processes": layout.processes,
        "num_machines": layout.machines,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    if layout.machines > 1:
        config.update(machine_rank=0, main_process_ip="MAIN_MACHINE_ADDRESS", main_process_port=29500)
    if distributed == "FSDP":
        config["fsdp_config"] = _fsdp_section(layout, activation_checkpointing, blocks)
    if layout.family == "zero":
        config["deepspeed_config"] = {
            "zero_stage": layout.zero_stage,
            "offload_optimizer_device": "cpu" if layout.offload_optimizer else "none",
            "offload_param_device": "cpu" if layout.offload_parameters else "none",
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "zero3_init_flag": layout.zero_stage == 3,
        }
    sizes: dict[str, int] = {}
    if layout.family == "hsdp":
        sizes = {"dp_replicate_size": layout.machines, "dp_shard_size": layout.per_machine}
    elif layout.family == "tp":
        sizes = {"dp_replicate_size": layout.data_parallel, "tp_size": layout.tp}
    elif layout.family == "fsdp2_tp":
        sizes = {"dp_shard_size": layout.data_parallel, "tp_size": layout.tp}
    elif layout.family == "cp":
        sizes = {"dp_shard_size": layout.data_parallel, "cp_size": layout.cp}
    if sizes:
        config["parallelism_config"] = {f"parallelism_config_{name}": size for name, size in sizes.items()}
    return config


def write_launch_config(path: Union[str, os.PathLike], config: dict[str, Any]) -> None:
    """Check ``config`` with the launcher's own reader, then write it as YAML to ``path``."""
    import yaml

    from ..config.config_file import normalize_config

    normalize_config(dict(config), source=os.fspath(path))
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
