"""Installing the ``torch_xla`` wheel that matches the installed torch, on a TPU host."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from typing import Optional

from packaging.version import Version

__all__ = ["install_xla", "xla_install_command"]

# Where pip finds libtpu (the TPU runtime that ``torch_xla[tpu]`` depends on).
LIBTPU_INDEXES = (
    "https://storage.googleapis.com/libtpu-releases/index.html",
    "https://storage.googleapis.com/libtpu-wheels/index.html",
)


def xla_install_command(upgrade: bool = False, torch_version: Optional[str] = None) -> list:
    """The pip command that installs ``torch_xla[tpu]`` for ``torch_version`` (default: the installed torch).

    torch_xla releases follow torch's: torch 2.13.x needs torch_xla 2.13.x, so the requirement is
    ``torch_xla[tpu]~=<major>.<minor>.0``. ``upgrade`` adds ``--upgrade`` (the newest matching patch release).
    """
    version = Version(torch_version or importlib.metadata.version("torch"))
    command = [sys.executable, "-m", "pip", "install"]
    if upgrade:
        command.append("--upgrade")
    command.append(f"torch_xla[tpu]~={version.major}.{version.minor}.0")
    for index in LIBTPU_INDEXES:
        command += ["-f", index]
    return command


def install_xla(upgrade: bool = False) -> None:
    """Install the torch_xla wheel matching the installed torch (TPU hosts, e.g. Colab or a TPU VM).

    Runs ``xla_install_command(upgrade)`` with pip; raises ``RuntimeError`` off Linux (torch_xla has Linux
    wheels only) and ``subprocess.CalledProcessError`` when pip fails.
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError(f"torch_xla is only published for Linux; this is {sys.platform}.")
    subprocess.run(xla_install_command(upgrade=upgrade), check=True)
