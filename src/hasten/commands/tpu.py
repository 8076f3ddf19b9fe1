"""``hasten tpu-config``: run set-up commands on every worker of a Google Cloud TPU pod, through ``gcloud``.

It builds one ``gcloud compute tpus tpu-vm ssh NAME --zone ZONE --command "..." --worker all`` call from the flags
and the config file (``tpu_name``, ``tpu_zone``, ``commands`` or ``command_file``; a flag wins) and runs it, or
prints it with ``--debug``. The commands run in ``/usr/share`` on every worker, after ``pip install`` of the
library when ``--install_accelerate`` asks (``--accelerate_version``: ``latest``, ``dev`` or a version number).
Training on TPUs is still planned; this only prepares the machines.
"""
from __future__ import annotations

import argparse
import sys

import shlex
import subprocess
from typing import Optional

from .errors import CommandError
from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "tpu_command_parser", "tpu_command_launcher", "main"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten tpu-config``."""
    parser = subparsers.add_parser("tpu-config", help="run set-up commands on every worker of a TPU pod",
                                   description="Run commands on every worker of a TPU pod, through gcloud.")
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


def tpu_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten tpu-config``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, tpu_command_launcher)


def _install_target(version: str) -> str:
    """What ``pip install`` gets for ``--accelerate_version``: ``latest`` (upgrade), ``dev`` (the repository) or a
    version number."""
    from packaging.version import InvalidVersion, Version

    if version == "latest":
        return "accelerate -U"
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    try:
        return f"accelerate=={Version(version)}"
    except InvalidVersion:
        raise CommandError(f"--accelerate_version {version!r}: use latest, dev or a version number such as 1.15.0.") \
            from None


def _pod_commands(args, config) -> list:
    """The commands to run, one per line: --command (each may be several words), else --command_file, else the
    config file's commands / command_file."""
    if args.command:
        return [" ".join(words) if isinstance(words, list) else str(words) for words in args.command]
    commands = list(config.get("commands") or [])
    command_file = args.command_file or (None if commands else config.get("command_file"))
    if command_file is not None:
        try:
            with open(command_file, encoding="utf-8") as handle:
                commands = [line for line in handle.read().splitlines() if line.strip()]
        except OSError as error:
            raise CommandError(f"--command_file {command_file}: {error.strerror or error}.") from None
    if not commands:
        raise CommandError("tpu-config needs something to run: give --command (repeatable) or --command_file, or "
                           "commands / command_file in the config file.")
    return commands


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The ``gcloud`` call ``tpu-config`` runs for ``args`` (the config file read for what the flags leave out)."""
    from .launch import load_launch_config

    _, config = load_launch_config(args.config_file)
    config = config or {}
    name = args.tpu_name or config.get("tpu_name")
    zone = args.tpu_zone or config.get("tpu_zone")
    missing = [flag for flag, value in (("--tpu_name", name), ("--tpu_zone", zone)) if not value]
    if missing:
        raise CommandError(f"tpu-config needs {' and '.join(missing)} (or tpu_name / tpu_zone in the config file).")
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_target(args.accelerate_version)}")
    steps += _pod_commands(args, config)
    prefix = ["gcloud", "alpha"] if args.use_alpha else ["gcloud"]
    return prefix + ["compute", "tpus", "tpu-vm", "ssh", str(name), "--zone", str(zone), "--command",
                     "; ".join(steps), "--worker", "all"]


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Run (or with ``--debug`` print) the ``gcloud`` call; a failed call raises ``CalledProcessError``."""
    command = gcloud_command(args)
    print(f"Running {' '.join(command)}", flush=True)
    if args.debug:
        return 0
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError:
        raise CommandError("tpu-config runs the Google Cloud CLI, and `gcloud` is not installed here (or not on "
                           "PATH): install the Google Cloud SDK first.") from None
    print(f"Successfully set up the pod: {shlex.join(command[:7])} ...", flush=True)
    return 0


run = tpu_command_launcher


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main(["tpu-config", *sys.argv[1:]]))
