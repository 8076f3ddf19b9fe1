"""``hasten merge-weights CHECKPOINT OUT``: merge a sharded FSDP checkpoint into one weights file, in one process
and without a process group (``OUT/model.safetensors``, or ``pytorch_model.bin`` with ``--unsafe_serialization``).

CHECKPOINT is a folder ``save_state`` wrote under FSDP's ``SHARDED_STATE_DICT`` (its ``pytorch_model_fsdp_0``
is merged) or such a DCP folder itself. Nothing in it is unpickled beyond metadata, tensors and plain values.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "merge_command", "merge_command_parser", "description", "main"]

# Accelerate's text, kept as the module's public value
description = ("Utility to merge the weights from multiple FSDP checkpoints into a single combined checkpoint. Should "
               "be used if\n`SHARDED_STATE_DICT` was used for the model. Weights will be saved to `{output_path}`.\n\n"
               "This is a CPU-bound process and requires enough RAM to load the entire model state dict.")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten merge-weights``."""
    parser = subparsers.add_parser("merge-weights", help="merge a sharded FSDP checkpoint into one weights file",
                                   description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_directory", help="a folder of sharded weights saved by FSDP")
    parser.add_argument("output_path", help="where to save the merged weights")
    add_flag(parser, "unsafe_serialization", action="store_true", default=False,
             help="save a pickled .bin instead of .safetensors (not recommended)")
    add_flag(parser, "remove_checkpoint_dir", action="store_true", default=False,
             help="remove the sharded checkpoint folder after merging")
    return parser


def merge_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten merge-weights``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, merge_command)


def merge_command(args: argparse.Namespace) -> None:
    """Merge ``args.checkpoint_directory`` (a checkpoint folder or its ``pytorch_model_fsdp_0``) into
    ``args.output_path``."""
    from pathlib import Path

    from ..checkpointing.sharded_files import ShardedFormat
    from ..strategies.fsdp.functions import merge_fsdp_weights
    from .errors import CommandError

    folder = Path(args.checkpoint_directory)
    if not folder.is_dir():
        raise CommandError(f"{folder} is not a folder: give the checkpoint folder save_state wrote under FSDP.")
    first_model = folder / ShardedFormat.model_folder(0)
    if not ShardedFormat.recognises(folder) and ShardedFormat.recognises(first_model):
        folder = first_model  # a whole checkpoint: its first model
    try:
        merge_fsdp_weights(str(folder), args.output_path, safe_serialization=not args.unsafe_serialization,
                           remove_checkpoint_dir=args.remove_checkpoint_dir)
    except ValueError as error:
        raise CommandError(str(error)) from None


run = merge_command


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main(["merge-weights", *sys.argv[1:]]))
