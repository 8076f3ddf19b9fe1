"""``hasten plan MODEL``: what each layout of a training run needs per rank, which fit, and a config to launch one.

The options are spelled as ``hasten launch`` spells its own; the work is ``hasten.planning.planner`` (see
docs/plan.md). MODEL is a local model folder, its ``config.json`` or a Hub id (the config alone is read; code it
names runs only with ``--trust_remote_code``); ``--factory module:function`` plans the user's own model instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Optional

from .errors import CommandError, ExistingFileError
from .utils import command_parser

__all__ = ["add_parser", "run", "plan_command_parser", "main"]


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _numbers(text: str) -> list[int]:
    try:
        return [int(part) for part in _comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers (e.g. 2,4,8)") \
            from None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from hasten.planning.names import FAMILIES, OPTIMIZER_NAMES

    parser = subparsers.add_parser(
        "plan", help="plan the memory per rank of every layout of a training run before launching it",
        description="Trace the model's training steps on fake tensors (nothing allocated or downloaded) and print, "
                    "for every layout (one device, DDP, FSDP2, FSDP1, ZeRO 0-3 with offload, tensor and context "
                    "parallelism), the peak memory per rank by part, whether it fits, host memory for loading and an "
                    "estimated step time. See docs/plan.md.")
    parser.add_argument("model", nargs="?", default=None,
                        help="a local model folder, its config.json, or a Hugging Face Hub model id")
    parser.add_argument("--factory", default=None, metavar="MODULE:FUNCTION",
                        help="plan the nn.Module this function returns (your own code) instead of MODEL")
    parser.add_argument("--batch_factory", default=None, metavar="MODULE:FUNCTION",
                        help="with --factory: a function (micro_batch_size, seq_len) -> the model's input")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true", default=False,
                        help="allow the modeling code a model folder names (auto_map) to run")
    parser.add_argument("--seq_len", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--micro_batch_size", type=int, default=1, help="sequences per process per forward")
    parser.add_argument("--search", action="store_true",
                        help="find, for each layout, the largest micro-batch size that fits")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--num_processes", type=int, default=1, help="processes (GPUs) of the whole job")
    parser.add_argument("--num_machines", type=int, default=1)
    parser.add_argument("--gpu_memory", default=None, metavar="SIZE",
                        help="memory of one device, e.g. 80GB or 79.6GiB (default: read from this GPU)")
    parser.add_argument("--reserve", default="0", metavar="SIZE",
                        help="memory per device kept out of the budget (CUDA context, allocator), e.g. 1GiB")
    parser.add_argument("--mixed_precision", default="bf16", choices=("no", "bf16", "fp16"))
    parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZER_NAMES)
    parser.add_argument("--activation_checkpointing", default="off", choices=("off", "on", "auto"),
                        help="auto: each layout that does not fit without it is planned with it")
    parser.add_argument("--layouts", type=_comma_list, default=None, metavar="NAMES",
                        help=f"families to consider, comma-separated (default all: {','.join(FAMILIES)})")
    parser.add_argument("--tp_sizes", type=_numbers, default=None, metavar="N,N",
                        help="tensor-parallel degrees (default: powers of two up to one machine's processes)")
    parser.add_argument("--cp_sizes", type=_numbers, default=None, metavar="N,N", help="context-parallel degrees")
    parser.add_argument("--gpu_tflops", type=float, default=None,
                        help="achieved TFLOP/s of one device for the step-time estimate (default 400)")
    parser.add_argument("--json", action="store_true", help="print the layouts as JSON (sizes in bytes)")
    parser.add_argument("--write_config", default=None, metavar="FILE",
                        help="write the best layout (or --layout's) as a config for hasten launch --config_file")
    parser.add_argument("--layout", default=None, metavar="NAME", help="with --write_config: the row to write")
    parser.add_argument("--overwrite", action="store_true", help="with --write_config: replace an existing file")
    return parser


def _user_function(spec: str, flag: str) -> Callable[..., Any]:
    """The function ``spec`` names on the command line (the user's own code, named explicitly)."""
    from .estimate import _resolve_factory

    try:
        return _resolve_factory(spec)
    except CommandError as error:
        raise CommandError(f"{flag}: {error}") from None


def run(args: argparse.Namespace) -> int:
    from hasten.planning.model_source import PlanInputError, factory_source
    from hasten.planning.planner import plan
    from hasten.planning.step_time import Hardware

    if (args.model is None) == (args.factory is None):
        raise CommandError("give MODEL (a model folder, config.json or Hub id) or --factory module:function, not "
                           "both.")
    if args.batch_factory and not args.factory:
        raise CommandError("--batch_factory goes with --factory.")
    if args.write_config and os.path.exists(args.write_config) and not args.overwrite:
        raise ExistingFileError(f"--write_config {args.write_config} exists: pass --overwrite to replace it.")
    model: Any = args.model
    if args.factory:
        batch = _user_function(args.batch_factory, "--batch_factory") if args.batch_factory else None
        model = factory_source(_user_function(args.factory, "--factory"), batch, name=args.factory)
    hardware = Hardware(tflops=args.gpu_tflops) if args.gpu_tflops else None
    try:
        result = plan(model, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size, search=args.search,
                      gradient_accumulation_steps=args.gradient_accumulation_steps,
                      num_processes=args.num_processes, num_machines=args.num_machines, gpu_memory=args.gpu_memory,
                      reserve=args.reserve, mixed_precision=args.mixed_precision, optimizer=args.optimizer,
                      activation_checkpointing=args.activation_checkpointing, layouts=args.layouts,
                      tp_sizes=args.tp_sizes, cp_sizes=args.cp_sizes, trust_remote_code=args.trust_remote_code,
                      hardware=hardware)
        config = result.launch_config(args.layout) if args.write_config else None
    except (PlanInputError, KeyError) as error:
        raise CommandError(str(error).strip("'\"")) from None
    if config is not None:
        from hasten.planning.launch_config import write_launch_config

        write_launch_config(args.write_config, config)
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        print(result.table())
        if config is not None:
            print(f"wrote {args.write_config}: run it with hasten launch --config_file {args.write_config} SCRIPT")
    return 0


def plan_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten plan``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, run)


def main() -> int:
    from .cli import main as cli_main

    return cli_main(["plan", *sys.argv[1:]])
