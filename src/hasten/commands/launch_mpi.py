"""Multi-CPU jobs started by ``mpirun`` (Accelerate's ``mpirun_config`` / ``--mpirun_hostfile``).

One ``mpirun`` starts the script on every machine of the hostfile, ``num_processes / num_machines`` per machine;
the launcher's ``HASTEN_*`` settings and the rendezvous address (``MASTER_ADDR`` / ``MASTER_PORT``) travel in the
environment, and each process takes its rank from MPI's variables (``PartialState``: Open MPI's
``OMPI_COMM_WORLD_*``, Intel MPI / MPICH's ``PMI_*``, MVAPICH's ``MV2_COMM_WORLD_*``), then joins the gloo group.
The ``mpirun`` flags follow its flavour, read from ``mpirun --version`` (Open MPI, Intel MPI, or MPICH-like).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import CommandError

__all__ = ["MpiRunner", "mpirun_flavour", "mpirun_command", "mpirun_hostfile"]


@dataclass
class MpiRunner:
    """The ``mpirun`` command line, and the variables it carries to the processes."""

    argv: list
    env: dict


def mpirun_hostfile(args: argparse.Namespace, config: Optional[Mapping]) -> Optional[str]:
    """``--mpirun_hostfile``, else the config file's ``mpirun_config.mpirun_hostfile`` (None: no mpirun)."""
    given = getattr(args, "mpirun_hostfile", None)
    if given is not None:
        return str(given)
    section = (config or {}).get("mpirun_config") or {}
    value = section.get("mpirun_hostfile") if isinstance(section, Mapping) else None
    return str(value) if value else None


def mpirun_flavour() -> tuple:
    """``(program, hostfile flag, process-count flag, per-machine flag, bind flag or None)`` for this ``mpirun``."""
    try:
        version = subprocess.check_output(["mpirun", "--version"], stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise CommandError("mpirun executable not found: the config file (or --mpirun_hostfile) asks for an MPI "
                           "launch; install an MPI (Intel MPI, Open MPI, MPICH) and put its mpirun on PATH, or "
                           "remove mpirun_config to launch with hasten launch on each machine.") from None
    except (OSError, subprocess.CalledProcessError) as error:
        raise CommandError(f"`mpirun --version` failed ({error}): check the MPI installation.") from None
    text = version.decode(errors="replace") if isinstance(version, bytes) else str(version)
    if "Open MPI" in text or "OpenRTE" in text:
        return "mpirun", "--hostfile", "-n", "--npernode", "--bind-to"
    if "Intel" in text:
        return "mpirun", "-f", "-n", "-ppn", None
    return "mpirun", "-f", "-n", "-ppn", "--bind-to"


def mpirun_command(args: argparse.Namespace, values: Mapping, hostfile: str, port: Optional[int],
                   env: Mapping) -> MpiRunner:
    """The ``mpirun ... python script args`` call for the resolved launch ``values`` (nothing is started)."""
    if not values.get("cpu"):
        raise CommandError("mpirun_config / --mpirun_hostfile launch multi-CPU jobs: add --cpu (use_cpu: true in "
                           "the config file), or remove the mpirun settings to launch on accelerators.")
    program, hostfile_flag, count_flag, per_machine_flag, bind_flag = mpirun_flavour()
    total, machines = int(values["num_processes"]), int(values["num_machines"])
    argv = [program, hostfile_flag, hostfile, per_machine_flag, str(total // machines), count_flag, str(total)]
    if bind_flag:
        argv += [bind_flag, "socket"]
    if getattr(args, "no_python", False):
        argv.append(args.training_script)
    else:
        argv.append(sys.executable)
        if getattr(args, "module", False):
            argv.append("-m")
        argv.append(args.training_script)
    argv += list(getattr(args, "training_script_args", None) or [])
    carried = dict(env)
    carried["MASTER_ADDR"] = str(values.get("main_process_ip") or "127.0.0.1")
    if port is not None:
        carried["MASTER_PORT"] = str(port)
    return MpiRunner(argv=argv, env=carried)
