"""``hasten to-fsdp2``: rewrite a config file's FSDP1 settings (``fsdp_config``) for FSDP2.

    hasten to-fsdp2 --config_file CONFIG (--output_file NEW | --overwrite)

Keys FSDP2 renamed are renamed (``fsdp_sharding_strategy`` becomes ``fsdp_reshard_after_forward``, with the
value translated), keys it dropped are removed with a warning, and ``fsdp_version: 2`` is set. The rest of
the file is kept as it is.
"""
from __future__ import annotations

import argparse
import enum
import logging
import sys
from pathlib import Path
from typing import Optional

import yaml

from .errors import CommandError, ExistingFileError, MissingFileError
from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "to_fsdp2_command", "to_fsdp2_command_parser", "convert_config_to_fsdp2",
           "load_config", "ConversionStatus", "ARGUMENT_KEY_MAPPING", "ARGUMENT_VALUE_MAPPING", "main"]

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# FSDP1 key -> its FSDP2 key, or why it has none
ARGUMENT_KEY_MAPPING = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

# FSDP1 sharding strategies as FSDP2's reshard_after_forward
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False,
            "NO_SHARD": False}
ARGUMENT_VALUE_MAPPING = {"fsdp_sharding_strategy": _RESHARD, "fsdp_reshard_after_forward": _RESHARD}


def convert_config_to_fsdp2(config: dict) -> dict:
    """``config`` with its ``fsdp_config`` in FSDP2 form (unchanged without one, or when already FSDP2)."""
    fsdp_config = config.get("fsdp_config") or {}
    if not fsdp_config:
        logger.info("No fsdp_config in the config file: nothing to convert.")
        return config
    if str(fsdp_config.get("fsdp_version", 1)) == "2":
        logger.warning("Config already specifies FSDP2, skipping conversion... (fsdp_version: 2; nothing converted). "
                       "If its keys still have their FSDP1 names, set fsdp_version: 1 and run again.")
        return config
    converted = {}
    for key, value in fsdp_config.items():
        target = ARGUMENT_KEY_MAPPING.get(key, key)  # keys FSDP2 did not change are kept
        if target is ConversionStatus.REMOVED:
            logger.warning("%s does not exist in FSDP2; removed.", key)
            continue
        if target is ConversionStatus.NOT_YET_IMPLEMENTED:
            logger.warning("%s is not implemented for FSDP2 yet; removed.", key)
            continue
        if key in ARGUMENT_VALUE_MAPPING:
            value = ARGUMENT_VALUE_MAPPING[key].get(value, value)
        converted[target] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str) -> dict:
    """The config file's mapping, as written (YAML or JSON)."""
    with open(config_file, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if not config:
        raise ValueError(f"The config file {config_file} is empty.")
    if not isinstance(config, dict):
        raise ValueError(f"The config file {config_file} does not hold a mapping of keys to values.")
    return config


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten to-fsdp2``."""
    parser = subparsers.add_parser("to-fsdp2", help="convert a config file's FSDP1 settings to FSDP2",
                                   description="Convert a config file's fsdp_config from FSDP1 to FSDP2.")
    add_flag(parser, "config_file", required=True, metavar="PATH", help="the config file to convert")
    add_flag(parser, "overwrite", action="store_true", default=False,
             help="write the result over --output_file, or over the config file when no --output_file is given")
    add_flag(parser, "output_file", default=None, metavar="PATH", help="where to write the converted config")
    return parser


def to_fsdp2_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten to-fsdp2``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, to_fsdp2_command)


def to_fsdp2_command(args: argparse.Namespace) -> int:
    """Convert and write; nothing is written when the input is missing or the output would be overwritten."""
    if not Path(args.config_file).is_file():
        raise MissingFileError(f"Config file `{args.config_file}` not found (--config_file): no such file.")
    output = args.output_file
    if output is None:
        if not args.overwrite:
            raise CommandError("say where to write: --output_file PATH, or --overwrite to replace the config file.")
        output = args.config_file
    elif Path(output).exists() and not args.overwrite:
        raise ExistingFileError(f"Output file `{output}` already exists and --overwrite is not set: pass --overwrite "
                                "to replace it, or another --output_file.")
    try:
        config = convert_config_to_fsdp2(load_config(args.config_file))
    except (ValueError, yaml.YAMLError) as error:
        raise CommandError(str(error)) from None
    with open(output, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    print(f"hasten to-fsdp2: wrote {output}")
    return 0


run = to_fsdp2_command


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main(["to-fsdp2", *sys.argv[1:]]))
