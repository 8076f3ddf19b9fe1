"""``hasten env``: versions, hardware and the active config file, as Markdown for a bug report."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from typing import Optional, Union

from .flags import add_flag
from .utils import command_parser

__all__ = ["add_parser", "run", "environment_report", "env_command_parser", "env_command", "main"]

# distribution name -> how it appears in the report (the optional extras and the reference library)
EXTRAS = {
    "deepspeed": "DeepSpeed",
    "bitsandbytes": "bitsandbytes",
    "torchdata": "torchdata",
    "megatron-core": "megatron-core",
    "torchao": "torchao",
    "tensorboard": "TensorBoard",
    "wandb": "wandb",
    "mlflow": "MLflow",
    "accelerate": "Accelerate (reference)",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten env``."""
    parser = subparsers.add_parser("env", help="print versions, hardware and the active config file",
                                   description="Print versions, hardware and the active config file as Markdown, "
                                               "ready to paste into a bug report.")
    add_flag(parser, "config_file", default=None, metavar="PATH",
             help="the config file to show (default: the one `hasten launch` reads)")
    return parser


def _version(distribution: str):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gib(size_bytes: float) -> str:
    return f"{size_bytes / 2**30:.2f} GiB"


def _cpu_lines() -> list:
    import psutil

    logical = psutil.cpu_count(logical=True)
    physical = psutil.cpu_count(logical=False)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    memory = psutil.virtual_memory()
    return [
        f"- CPU: {platform.processor() or platform.machine()}, {physical or '?'} physical / {logical} logical cores "
        f"({usable} usable by this process)",
        f"- System RAM: {_gib(memory.total)} ({_gib(memory.available)} available)",
    ]


def _accelerator_lines(torch) -> list:
    lines = []
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        backend = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {getattr(torch.version, 'hip', '?')}"
        lines.append(f"- GPUs: {count} ({backend})")
        for index in range(count):
            properties = torch.cuda.get_device_properties(index)
            lines.append(f"  - cuda:{index}: {properties.name}, {_gib(properties.total_memory)}")
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        count = torch.xpu.device_count()
        lines.append(f"- XPUs: {count}")
        for index in range(count):
            lines.append(f"  - xpu:{index}: {torch.xpu.get_device_name(index)}")
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        lines.append("- GPU: Apple MPS")
    else:
        lines.append("- GPUs: none (CPU only)")
    return lines


def _config_lines(config_file) -> list:
    if config_file is None:
        try:
            from ..config.config_file import default_config_path

            config_file = default_config_path()
        except ImportError:
            return ["- Config file: (cannot be located in this installation)"]
        label = "default config file"
    else:
        label = "config file"
    if not os.path.isfile(config_file):
        return [f"- {label.capitalize()}: none (`{config_file}` does not exist)"]
    with open(config_file, encoding="utf-8") as handle:
        text = handle.read().rstrip()
    fence = "json" if str(config_file).lower().endswith(".json") else "yaml"
    return [f"- {label.capitalize()}: `{config_file}`", "", f"```{fence}", text, "```"]


def environment_report(config_file: Optional[Union[str, os.PathLike]] = None) -> str:
    """The report as Markdown text."""
    import numpy
    import torch

    from ..core.versions import HASTEN_VERSION as __version__

    launch_variables = sorted(key for key in os.environ if key.startswith("HASTEN_"))
    lines = [
        "## hasten environment",
        "",
        f"- `hasten` version: {__version__}",
        f"- Platform: {platform.platform()}",
        f"- Python version: {platform.python_version()} ({sys.executable})",
        f"- PyTorch version: {torch.__version__}",
        f"- NumPy version: {numpy.__version__}",
        *_cpu_lines(),
        *_accelerator_lines(torch),
        "- Optional packages:",
        *(f"  - {label}: {_version(name) or 'not installed'}" for name, label in EXTRAS.items()),
        f"- HASTEN_* variables set: {', '.join(launch_variables) if launch_variables else 'none'}",
        *_config_lines(config_file),
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Print the report."""
    print("Copy and paste the text below into your bug report.\n")
    print(environment_report(args.config_file))
    return 0


env_command = run


def env_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten env``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, env_command)


def main() -> int:
    from .cli import main as cli_main

    return cli_main(["env", *sys.argv[1:]])
