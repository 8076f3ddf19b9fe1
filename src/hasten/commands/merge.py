"""``hasten merge-weights``: merge a sharded FSDP checkpoint into one weights file (planned, with FSDP).

The command parses Accelerate's arguments and, when run, raises ``NotYetSupportedError``.
"""
from __future__ import annotations

import argparse
import sys

from ..utils.planned import not_yet_supported
from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "merge_command", "merge_command_parser", "description", "main"]

# Accelerate's text, kept as the module's public value
description = ("Utility to merge the weights from multiple FSDP checkpoints into a single combined checkpoint. Should "
               "be used if\n`SHARDED_STATE_DICT` was used for the model. Weights will be saved to `{output_path}`.\n\n"
               "This is a CPU-bound process and requires enough RAM to load the entire model state dict.")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hasten merge-weights``."""
    parser = subparsers.add_parser("merge-weights", help="merge a sharded FSDP checkpoint (not yet supported)",
                                   description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_directory", help="a folder of sharded weights saved by FSDP")
    parser.add_argument("output_path", help="where to save the merged weights")
    add_flag(parser, "unsafe_serialization", action="store_true", default=False,
             help="save a pickled .bin instead of .safetensors (not recommended)")
    add_flag(parser, "remove_checkpoint_dir", action="store_true", default=False,
             help="remove the sharded checkpoint folder after merging")
    return parser


def merge_command_parser(subparsers=None) -> argparse.ArgumentParser:
    """``hasten merge-weights``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, merge_command)


def merge_command(args):
    """Raises ``NotYetSupportedError``: FSDP checkpoints come with the FSDP backend."""
    raise not_yet_supported("Merging sharded FSDP checkpoints (merge-weights)",
                            "save full weights with Accelerator.save_model")


run = merge_command


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main(["merge-weights", *sys.argv[1:]]))
