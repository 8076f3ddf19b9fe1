"""``hasten config``: answer a few questions in the terminal and save them as the config file."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Optional

from ...config.config_file import default_config_path
from ...config.enums import ComputeEnvironment
from ..errors import CommandError
from ..flags import add_flag
from .cluster import get_cluster_input
from .questions import ask_choice
from .sagemaker import get_sagemaker_input

if TYPE_CHECKING:
    from .config_args import ClusterConfig

__all__ = ["config_command_parser", "config_command", "get_user_input", "description", "main"]

# Accelerate's text, kept as the module's public value
description = ("Launches a series of prompts to create and save a `default_config.yaml` configuration file for your "
               "training system. Should always be ran first on your machine")
_DESCRIPTION = ("Answer a few questions about this machine (and the others, for multi-node training) and save the "
                "answers as a config file that `hasten launch` reads. `hasten config default` writes one without "
                "questions.")


def get_user_input() -> ClusterConfig:
    """Ask where training runs, then the questions for it; the config object."""
    environment = ask_choice("In which compute environment are you running?",
                             [("This machine (and others you launch on yourself)", ComputeEnvironment.LOCAL_MACHINE),
                              ("AWS (Amazon SageMaker)", ComputeEnvironment.AMAZON_SAGEMAKER)])
    if environment == ComputeEnvironment.AMAZON_SAGEMAKER:
        return get_sagemaker_input()
    return get_cluster_input()


def config_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten config``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    if subparsers is not None:
        parser = subparsers.add_parser("config", help="write a config file (questions, or `default` at once)",
                                       description=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("hasten config", description=_DESCRIPTION)
    add_flag(parser, "config_file", default=None, metavar="PATH",
             help="where to save (default: the file `hasten launch` reads by default)")
    if subparsers is not None:
        parser.set_defaults(func=config_command)
    return parser


def _save(config, config_file: str) -> None:
    """Write the file whole or not at all: a temporary file next to it, then renamed over it."""
    folder = os.path.dirname(os.path.abspath(config_file))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".hasten-config-", suffix=os.path.splitext(config_file)[1],
                                         dir=folder)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would differ from any other file the user writes
    try:
        if config_file.endswith(".json"):
            config.to_json_file(temporary)
        else:
            config.to_yaml_file(temporary)
        os.replace(temporary, config_file)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def config_command(args: argparse.Namespace) -> int:
    """Ask the questions (a terminal is needed) and save the answers; 0 when saved, 130 when cancelled."""
    if not sys.stdin.isatty():
        raise CommandError("`hasten config` asks questions and needs a terminal (its input is not one). Without a "
                           "terminal, write a config file with `hasten config default [--config_file PATH] "
                           "[--mixed_precision bf16]` and edit it, or give the settings to `hasten launch` as "
                           "flags (--num_processes, --mixed_precision, --use_fsdp ...).")
    config_file = args.config_file or default_config_path()
    if os.path.exists(config_file):
        print(f"hasten config: {config_file} exists; it is replaced once every question is answered (Ctrl+C "
              "leaves it as it is).")
    try:
        config = get_user_input()
    except KeyboardInterrupt:
        print("\nhasten config: cancelled; nothing was saved.", file=sys.stderr)
        return 130
    _save(config, config_file)
    print(f"hasten config: saved {config_file}")
    return 0


def main() -> None:
    sys.exit(config_command(config_command_parser().parse_args()))
