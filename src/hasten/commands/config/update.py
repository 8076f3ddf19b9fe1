"""``hasten config update``: rewrite a config file in today's format, keeping its settings.

Old keys (``fp16: true``, a top-level ``dynamo_backend``) become today's and missing defaults are filled in.
"""
from __future__ import annotations

import argparse
import os

from ...config.config_file import default_config_path
from ..errors import CommandError
from ..flags import add_flag
from .config_args import load_config_from_file
from .config_utils import SubcommandHelpFormatter

__all__ = ["update_command_parser", "update_config_command", "update_config", "description"]

# Accelerate's text, kept as the module's public value
description = "Update an existing config file with the latest defaults while maintaining the old configuration."


def update_config(args: argparse.Namespace) -> str:
    """Rewrite ``args.config_file`` (default: the default file) and return its path."""
    config_file = args.config_file or default_config_path()
    if not os.path.isfile(config_file):
        raise CommandError(f"{config_file} does not exist: pass --config_file PATH of the file to update.")
    try:
        config = load_config_from_file(config_file)
    except (ValueError, TypeError) as error:
        raise CommandError(f"cannot update {config_file}: {error}") from None
    if config_file.endswith(".json"):
        config.to_json_file(config_file)
    else:
        config.to_yaml_file(config_file)
    return config_file


def update_command_parser(parser: argparse._SubParsersAction,
                          parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``update`` on ``parser`` (the subparsers of ``hasten config``)."""
    parser = parser.add_parser("update", parents=parents, formatter_class=SubcommandHelpFormatter,
                               help="rewrite a config file in today's format", description=description)
    add_flag(parser, "config_file", default=None, metavar="PATH",
             help="the file to update (default: the file `hasten launch` reads by default)")
    parser.set_defaults(func=update_config_command)
    return parser


def update_config_command(args: argparse.Namespace) -> int:
    print(f"hasten config update: updated {update_config(args)}")
    return 0
