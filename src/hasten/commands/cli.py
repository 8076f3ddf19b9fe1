"""``hasten``: the command-line entry point (also ``python -m hasten``).

Only the chosen subcommand's module is imported, so ``hasten launch`` does not pay for ``hasten env``'s
imports and a subcommand that cannot be loaded does not break the others. Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

from ..core.planned import NotYetSupportedError
from .errors import CommandError
from .utils import CustomArgumentParser

# subcommand -> module defining add_parser(subparsers) and run(args) -> int
COMMANDS = {
    "launch": "hasten.commands.launch",
    "env": "hasten.commands.env",
    "config": "hasten.commands.config",
    "test": "hasten.commands.test",
    "estimate-memory": "hasten.commands.estimate",
    "plan": "hasten.commands.plan",
    "merge-weights": "hasten.commands.merge",
    "to-fsdp2": "hasten.commands.to_fsdp2",
    "tpu-config": "hasten.commands.tpu",
    "report": "hasten.commands.report",
}

# one line per subcommand for `hasten --help`, shown without importing the modules
SUMMARIES = {
    "launch": "run a script on N processes and/or machines (torchrun's elastic agent underneath)",
    "env": "print versions, hardware and the active config file, ready to paste into a bug report",
    "config": "write a config file: `hasten config` asks questions, `hasten config default` writes one at once",
    "test": "check that this machine can run a multi-process job (a bundled sanity script)",
    "estimate-memory": "estimate the memory a model needs to load and train",
    "plan": "plan the memory per rank of every layout of a training run, and write a config for the one that fits",
    "merge-weights": "merge a sharded FSDP checkpoint into one file (not yet supported)",
    "to-fsdp2": "convert a config file's FSDP1 settings to FSDP2",
    "tpu-config": "run setup commands on a TPU pod (not yet supported)",
    "report": "write an HTML page of a run's logged curves (JSONL / TensorBoard logs) and its config",
}


def _chosen(argv: Sequence[str]) -> Optional[str]:
    """The subcommand named first on the command line, if it is one we know."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def build_parser(chosen: Optional[str] = None) -> tuple[argparse.ArgumentParser, Optional[ModuleType]]:
    """The ``hasten`` parser; only ``chosen``'s module is imported to define its options.

    Returns ``(parser, module)`` where ``module`` is the chosen subcommand's module (or None).
    """
    from ..core.versions import HASTEN_VERSION as __version__

    parser = argparse.ArgumentParser(
        prog="hasten", description="Run one PyTorch script on one CPU, one GPU, many processes or many machines.",
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                       parser_class=CustomArgumentParser)
    module = None
    for name, module_name in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=SUMMARIES.get(name, ""), add_help=False)
    return parser, module


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``hasten <command> ...`` and return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(argv)
    try:
        try:
            parser, module = build_parser(chosen)
        except ModuleNotFoundError as error:
            if chosen is None or error.name != COMMANDS[chosen]:
                raise
            print(f"hasten: the `{chosen}` command is not available in this installation "
                  f"(module {COMMANDS[chosen]} is missing).", file=sys.stderr)
            return 2
        args = parser.parse_args(argv)
        if module is None:  # `hasten` alone
            parser.print_help(sys.stderr)
            return 2
        return int(module.run(args) or 0)
    except SystemExit as exit_:  # argparse: --help, --version, usage errors
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except (CommandError, NotYetSupportedError) as error:
        print(f"hasten {chosen}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
