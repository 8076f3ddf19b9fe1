"""``hasten launch``'s DeepSpeed group across machines: DeepSpeed's own multi-node runner. The group's flags and a
config file's ``deepspeed_config`` section are resolved in ``config/deepspeed_launch.py``.

On one machine, and across machines when no DeepSpeed launcher is asked for, the job runs through hasten's
torchrun launch: DeepSpeed then starts on the process group hasten created. With ``--num_machines > 1`` and
``--deepspeed_hostfile`` / ``--deepspeed_multinode_launcher`` (other than ``standard``), one ``hasten launch``
on machine 0 starts ``python -m deepspeed.launcher.runner``, which reaches the other machines itself (pdsh,
MPI, slurm ...). Nothing is started in this module: ``runner_command`` returns that command line.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..config.deepspeed_launch import DeepSpeedSettings
from .errors import CommandError

__all__ = ["RUNNER", "INSTALL_HINT", "DeepSpeedRunner", "deepspeed_installed", "uses_runner", "runner_command",
           "env_file_text"]

RUNNER = "deepspeed.launcher.runner"
INSTALL_HINT = "pip install 'hasten[deepspeed]'"


def deepspeed_installed() -> bool:
    """Whether ``deepspeed`` can be imported here (without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


def uses_runner(settings: DeepSpeedSettings, num_machines: int) -> bool:
    """Whether DeepSpeed's multi-node runner starts the job: DeepSpeed on several machines, with a hostfile or a
    launcher other than ``standard`` (which is one ``hasten launch`` per machine, like any other job)."""
    values = settings.values
    if not settings.enabled or num_machines <= 1:
        return False
    if values.get("deepspeed_multinode_launcher") == "standard":
        return False
    return "deepspeed_hostfile" in values or "deepspeed_multinode_launcher" in values


_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")


def _check_hostfile(path: Optional[str], origin: str, num_machines: int) -> None:
    if not path:
        raise CommandError(f"{origin}: DeepSpeed's multi-node runner needs --deepspeed_hostfile PATH, a file of "
                           "lines 'HOSTNAME slots=GPUS', one per machine. Or use --deepspeed_multinode_launcher "
                           "standard and run hasten launch on each machine.")
    if not os.path.isfile(path):
        raise CommandError(f"--deepspeed_hostfile {path!r}: no such file (looked from {os.getcwd()}).")
    hosts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.match(line)
        if not match:
            raise CommandError(f"--deepspeed_hostfile {path}: line {number} {line!r} is not 'HOSTNAME slots=N'.")
        hosts.append(match.group(1))
    if len(hosts) < num_machines:
        raise CommandError(f"--deepspeed_hostfile {path} lists {len(hosts)} machine(s), but --num_machines is "
                           f"{num_machines}: add the missing machines or lower --num_machines.")


@dataclass
class DeepSpeedRunner:
    """DeepSpeed's runner command line, and the variables it must carry to every machine."""

    argv: list
    env: dict  # the workers' HASTEN_* settings: set for the runner and written to its environment file


def runner_command(args: argparse.Namespace, settings: DeepSpeedSettings, values: Mapping, port: int, env: Mapping,
                   worker_module: str, installed: Optional[Callable[[], bool]] = None) -> DeepSpeedRunner:
    """``python -m deepspeed.launcher.runner ...`` for a multi-machine DeepSpeed job (nothing is started).

    Each worker runs the script through ``worker_module`` (as hasten's torchrun launch does), without DeepSpeed's
    ``--local_rank`` argument (the script reads ``LOCAL_RANK``). Raises ``CommandError`` for bad input, and when
    deepspeed is not installed.
    """
    installed = deepspeed_installed if installed is None else installed
    ds = settings.values
    launcher = ds.get("deepspeed_multinode_launcher", "pdsh")
    origin = f"--num_machines {values['num_machines']} with DeepSpeed's {launcher} launcher"
    if not installed():
        raise CommandError(f"{origin} needs the deepspeed package, which is not installed: {INSTALL_HINT}.")
    if values.get("min_machines", values["num_machines"]) != values["num_machines"]:
        raise CommandError(f"{origin}: DeepSpeed's runner starts a fixed number of machines; an elastic "
                           f"--num_machines MIN:MAX needs --deepspeed_multinode_launcher standard.")
    if values.get("gpu_ids") and str(values["gpu_ids"]).strip().lower() != "all":
        raise CommandError(f"{origin}: --gpu_ids does not reach the other machines; choose GPUs with "
                           "--deepspeed_inclusion_filter HOST:0,1 instead.")
    _check_hostfile(ds.get("deepspeed_hostfile"), origin, values["num_machines"])
    argv = [sys.executable, "-u", "-m", RUNNER, "--hostfile", str(ds["deepspeed_hostfile"])]
    if launcher == "nossh":
        argv += ["--no_ssh", "--node_rank", str(values["machine_rank"])]
    else:
        argv += ["--launcher", launcher]
    argv.append("--no_local_rank")
    if "deepspeed_exclusion_filter" in ds:
        argv += ["--exclude", str(ds["deepspeed_exclusion_filter"])]
    elif "deepspeed_inclusion_filter" in ds:
        argv += ["--include", str(ds["deepspeed_inclusion_filter"])]
    else:
        argv += ["--num_nodes", str(values["num_machines"]),
                 "--num_gpus", str(values["num_processes"] // values["num_machines"])]
    argv += ["--master_addr", str(values["main_process_ip"]), "--master_port", str(port)]
    script_args = [str(arg) for arg in (args.training_script_args or [])]
    if args.no_python:
        argv += ["--no_python", args.training_script, *script_args]
    else:
        mode = "module" if args.module else "path"
        argv += ["--module", worker_module, mode, args.training_script, *script_args]
    return DeepSpeedRunner(argv=argv, env=dict(env))


def env_file_text(variables: Mapping, existing: str = "") -> str:
    """The runner's environment file (``NAME=VALUE`` lines, which it exports on every machine): ``existing``
    (the user's own ``.deepspeed_env``) first, then ``variables``. A value with a line break cannot be carried."""
    lines = [line for line in existing.splitlines() if line.strip()]
    for name, value in variables.items():
        text = str(value)
        if "\n" in text or "\r" in text:
            raise CommandError(f"{name}: a value with a line break cannot be carried to the other machines by "
                               "DeepSpeed's runner.")
        lines.append(f"{name}={text}")
    return "\n".join(lines) + "\n"
