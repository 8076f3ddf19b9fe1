"""``hasten config default``: write a config file for this machine (never over an existing one).

    hasten config default [--config_file PATH] [--mixed_precision no|fp16|bf16|fp8]

The file goes to ``default_config_path()`` unless ``--config_file`` says otherwise; ``hasten launch``
reads it from there automatically. The interactive questionnaire of ``accelerate config`` is not
provided: write the default file, then edit it (the format is documented in docs/config-file.md).
"""
from __future__ import annotations

import argparse
import sys

from ._errors import CommandError
from ._flags import add_flag

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hasten config`` and its ``default`` action."""
    parser = subparsers.add_parser("config", help="write a default config file (`hasten config default`)",
                                   description="Write and inspect hasten config files.")
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION")
    default = actions.add_parser("default", help="write a config file for this machine",
                                 description="Write a config file for this machine: all its GPUs, or the CPU. "
                                             "An existing file is left untouched (the command then fails).")
    add_flag(default, "config_file", default=None, metavar="PATH",
             help="where to write (default: the file `hasten launch` reads by default)")
    add_flag(default, "mixed_precision", default="no", metavar="MODE", help="no (default), fp16, bf16 or fp8")
    return parser


def run(args) -> int:
    """Write the file; 0 when written, 1 when a file was already there."""
    if getattr(args, "config_action", None) != "default":
        raise CommandError("choose an action: `hasten config default [--config_file PATH] [--mixed_precision "
                           "bf16]` writes a config file you can then edit (there is no interactive questionnaire).")
    from ..config.config_file import default_config_path, write_basic_config

    location = args.config_file or default_config_path()
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
