"""``hasten config``: write the config file ``hasten launch`` reads.

    hasten config [--config_file PATH]            questions in the terminal, answers saved
    hasten config default [--config_file PATH] [--mixed_precision no|fp16|bf16|fp8]
    hasten config update [--config_file PATH]     rewrite an old file in today's format

The file goes to ``default_config_path()`` unless ``--config_file`` says otherwise; the format is documented in
docs/config-file.md. The submodules keep Accelerate's layout (``config_args``, ``default``, ``update`` ...).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from .config import config_command, config_command_parser
from .config_args import default_config_file, load_config_from_file
from .default import default_command_parser
from .update import update_command_parser

__all__ = ["add_parser", "run", "get_config_parser", "main", "config_command_parser", "default_command_parser",
           "update_command_parser", "default_config_file", "load_config_from_file"]


def get_config_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten config`` with its ``default`` and ``update`` actions (on ``subparsers`` when given)."""
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_parser = config_command_parser(subparsers)
    actions = config_parser.add_subparsers(title="actions", dest="subcommand", metavar="ACTION")
    default_command_parser(actions, parents=[parent])
    update_command_parser(actions, parents=[parent])
    return config_parser


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten config`` on the ``hasten`` parser."""
    return get_config_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    """The chosen action (``default``, ``update``), else the questions."""
    return int(getattr(args, "func", config_command)(args) or 0)


def main() -> None:
    parser = get_config_parser()
    args = parser.parse_args()
    sys.exit(run(args))
