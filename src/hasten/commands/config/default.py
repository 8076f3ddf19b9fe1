"""``hasten config default``: write a config file for this machine at once (never over an existing one).

    hasten config default [--config_file PATH] [--mixed_precision no|fp16|bf16|fp8]
"""
from __future__ import annotations

import argparse
import sys

from ...config.config_file import default_config_path, write_basic_config
from ..errors import CommandError
from ..flags import add_flag
from .config_utils import SubcommandHelpFormatter

__all__ = ["default_command_parser", "default_config_command", "write_basic_config", "description"]

# Accelerate's text, kept as the module's public value
description = "Create a default config file for Accelerate with only a few flags set."


def default_command_parser(parser: argparse._SubParsersAction,
                           parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``default`` on ``parser`` (the subparsers of ``hasten config``)."""
    parser = parser.add_parser(
        "default", parents=parents, formatter_class=SubcommandHelpFormatter,
        help="write a config file for this machine", description="Write a config file for this machine: all its "
        "GPUs, or the CPU. An existing file is left untouched (the command then fails).")
    add_flag(parser, "config_file", default=None, metavar="PATH", dest="save_location",
             help="where to write (default: the file `hasten launch` reads by default)")
    add_flag(parser, "mixed_precision", default="no", metavar="MODE", help="no (default), fp16, bf16 or fp8")
    parser.set_defaults(func=default_config_command)
    return parser


def default_config_command(args: argparse.Namespace) -> int:
    """Write the file; 0 when written, 1 when a file was already there."""
    location = args.save_location or default_config_path()
    try:
        written = write_basic_config(mixed_precision=args.mixed_precision, save_location=location)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if not written:
        print(f"hasten config default: {location} already exists and was not changed; delete it first to write a "
              "new one.", file=sys.stderr)
        return 1
    print(f"hasten config default: wrote {written}")
    return 0
