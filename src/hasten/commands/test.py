"""``hasten test``: launch the bundled sanity script with ``hasten launch`` and say whether it worked.

    hasten test [--config_file PATH] [-n N]

It runs exactly what a training job would: ``hasten launch`` with the config file (and ``-n`` when
given), so a pass means this machine and config can run multi-process jobs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Optional, Union

from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "sanity_launch_command", "test_command", "test_command_parser", "main"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten test``."""
    parser = subparsers.add_parser("test", help="check that this machine can run a multi-process job",
                                   description="Launch a bundled sanity script (process state, all-gather, "
                                               "broadcast, barrier) with `hasten launch` and report pass/fail.")
    add_flag(parser, "config_file", default=None, metavar="PATH",
             help="config file for the launch (default: the one `hasten launch` reads)")
    add_flag(parser, "num_processes", "-n", type=int, default=None, metavar="N",
             help="number of processes (default: from the config file)")
    return parser


def sanity_launch_command(config_file: Optional[Union[str, os.PathLike]] = None,
                          num_processes: Optional[int] = None) -> list[str]:
    """The ``hasten launch`` command line ``hasten test`` runs."""
    from ..test_utils import sanity_script_path

    command = [sys.executable, "-m", "hasten", "launch"]
    if config_file:
        command += ["--config_file", str(config_file)]
    if num_processes is not None:
        command += ["--num_processes", str(num_processes)]
    return command + [str(sanity_script_path())]


def run(args: argparse.Namespace) -> int:
    """Run the launch, streaming its output, then print the verdict."""
    command = sanity_launch_command(args.config_file, getattr(args, "num_processes", None))
    print("hasten test: running hasten " + " ".join(command[3:]), flush=True)
    code = subprocess.call(command)
    if code == 0:
        print("hasten test: PASSED - this machine is ready for distributed jobs with this configuration.")
        return 0
    print(f"hasten test: FAILED (exit status {code}); the output above shows which process failed and why.",
          file=sys.stderr)
    return 1


def test_command(args: argparse.Namespace) -> None:
    """Accelerate's in-process entry point: like ``hasten test``; a failed check raises ``RuntimeError`` (a caller
    must never read a failure as success)."""
    if run(args):
        raise RuntimeError("hasten test failed: the sanity check did not pass on this configuration (its output "
                           "above names the process and the cause).")


def test_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten test``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, test_command)


def main() -> int:
    from .cli import main as cli_main

    return cli_main(["test", *sys.argv[1:]])
