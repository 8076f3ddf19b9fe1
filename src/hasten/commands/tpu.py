"""``hasten tpu-config``: run set-up commands on every worker of a TPU pod (planned, with TPU support).

The command parses Accelerate's arguments and, when run, raises ``NotYetSupportedError``.
"""
from __future__ import annotations

import argparse
import sys

from ..core.planned import not_yet_supported
from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "tpu_command_parser", "tpu_command_launcher", "main"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hasten tpu-config``."""
    parser = subparsers.add_parser("tpu-config", help="run set-up commands on a TPU pod (not yet supported)",
                                   description="Run commands on every worker of a TPU pod (not yet supported).")
    config = parser.add_argument_group("config", "settings a config file can hold")
    add_flag(config, "config_file", default=None, metavar="PATH", help="the config file to read")
    add_flag(config, "tpu_name", default=None, help="the TPU to use (default: the config file's)")
    add_flag(config, "tpu_zone", default=None, help="its zone (default: the config file's)")
    pod = parser.add_argument_group("pod", "what runs on the pod")
    add_flag(pod, "use_alpha", action="store_true", help="use `gcloud alpha`")
    add_flag(pod, "command_file", default=None, metavar="PATH", help="a file of commands to run on start-up")
    add_flag(pod, "command", action="append", nargs="+", help="a command to run (repeatable)")
    add_flag(pod, "install_accelerate", action="store_true", help="install the library on the pod first")
    add_flag(pod, "accelerate_version", default="latest", help="the version to install")
    add_flag(pod, "debug", action="store_true", help="print the command instead of running it")
    return parser


def tpu_command_parser(subparsers=None) -> argparse.ArgumentParser:
    """``hasten tpu-config``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, tpu_command_launcher)


def tpu_command_launcher(args):
    """Raises ``NotYetSupportedError``: hasten does not run on TPUs yet."""
    raise not_yet_supported("TPU pods (tpu-config)", "run on GPUs or the CPU")


run = tpu_command_launcher


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main(["tpu-config", *sys.argv[1:]]))
