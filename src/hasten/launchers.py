"""Start a training *function* on several processes from Python (a notebook, a test), not from the shell.

``notebook_launcher`` and ``debug_launcher`` hand the work to torchrun's elastic agent
(``torch.distributed.launcher.api.elastic_launch``), the same engine ``hasten launch`` uses.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Union

from .config.enums import PrecisionType
from .core.env_vars import env_name, patch_environment
from .core.environment import are_libraries_initialized
from .core.network import find_free_port, is_port_in_use

__all__ = ["notebook_launcher", "debug_launcher", "test_launch"]


def test_launch() -> None:
    """Check that a ``PartialState`` can be created (what a launched process does first)."""
    from .state import PartialState

    PartialState()


class _NamedEntrypoint:
    """The launched callable, under a ``__name__`` and ``__qualname__`` (torchrun's agent logs its entrypoint's
    name; a ``functools.partial`` or a callable object has none). In the worker it first asks to end with the
    launching process (Linux, see ``hasten.commands.parent_watch``): a killed notebook leaves no workers
    behind. Picklable when the callable is (spawn start method)."""

    def __init__(self, function: Callable):
        self.function = function
        self.launcher_pid = os.getpid()
        inner = getattr(function, "func", None)  # functools.partial
        if hasattr(function, "__name__") and hasattr(function, "__qualname__"):
            self.__name__, self.__qualname__ = function.__name__, function.__qualname__
        else:
            self.__name__ = self.__qualname__ = (
                f"partial({getattr(inner, '__qualname__', type(inner).__name__)})" if inner is not None
                else type(function).__qualname__)

    def __call__(self, *args):
        from .commands.parent_watch import end_with_parent
        from .state import AcceleratorState, GradientState

        end_with_parent(self.launcher_pid)
        # a forked worker inherits the launching process's state objects (a notebook or a test suite that made an
        # Accelerator before): this process starts its own, as a launched one does
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        return self.function(*args)


def _entrypoint(function: Callable) -> Callable:
    if not callable(function):
        raise TypeError(f"The launcher runs a callable (a function, functools.partial, ...); got {function!r}.")
    return _NamedEntrypoint(function)


#: Libraries that set up the GPU when they are imported: a worker forked after such an import starts with a device
#: state it cannot use.
DEVICE_INITIALISING_LIBRARIES = ("bitsandbytes",)


def _default_start_method() -> str:
    """fork where it exists and is safe (it also works for functions defined in a notebook), else spawn.

    Forking is refused where a GPU is present and the device may already be set up in this process: torch's CUDA is
    initialised, or a library that initialises it on import (``DEVICE_INITIALISING_LIBRARIES``) was imported. On a
    machine without a GPU those imports touch no device and the launch goes on."""
    import torch

    if sys.platform == "win32":
        return "spawn"
    if not torch.cuda.is_available():
        return "fork"
    imported = are_libraries_initialized(*DEVICE_INITIALISING_LIBRARIES)
    if imported:
        raise RuntimeError(
            "Could not start distributed process: libraries known to initialize the device upon import were imported "
            f"already ({', '.join(imported)}). Please keep these imports inside your training function, restart the "
            "notebook and launch again (or pass start_method='spawn', which does not fork this process)."
        )
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was already initialised in this process, so worker processes cannot be forked. Restart the "
            "notebook and call notebook_launcher before anything touches the GPU (no tensor on 'cuda', no "
            "Accelerator() in the notebook itself)."
        )
    return "fork"


def notebook_launcher(function: Callable[..., Any], args: tuple = (), num_processes: Optional[int] = None,
                      mixed_precision: Union[str, PrecisionType] = "no", use_port: Union[int, str] = "29500",
                      master_addr: str = "127.0.0.1", node_rank: int = 0, num_nodes: int = 1,
                      rdzv_backend: str = "static", rdzv_endpoint: str = "", rdzv_conf: Optional[dict[str, Any]] = None,
                      rdzv_id: str = "none", max_restarts: int = 0, monitor_interval: float = 0.1,
                      log_line_prefix_template: Optional[str] = None, start_method: Optional[str] = None, *,
                      _always_launch: bool = False) -> Any:
    """Run ``function(*args)`` on ``num_processes`` processes of this machine (default: one per GPU, else 1).

    ``function`` is any callable (a function, a ``functools.partial``, an object with ``__call__``). Works on
    CPU-only machines too (gloo). ``use_port="0"`` picks a free port; a busy port is an error.
    Returns what ``function`` returned on each local process, as a dict ``{local_rank: value}``, when more
    than one process ran, else the value itself. One process runs ``function`` in this process (``debug_launcher``
    starts one all the same). Each started process begins with fresh state: an Accelerator created in the notebook
    before does not leak into it (a process group or CUDA started here does stop the launch: they cannot be
    forked).
    """
    import torch
    import torch.distributed as dist

    function = _entrypoint(function)
    precision = PrecisionType.parse(mixed_precision, "mixed_precision").value
    if num_processes is None:
        num_processes = torch.cuda.device_count() or 1
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive int, got {num_processes!r}.")
    if num_processes == 1 and num_nodes == 1 and not _always_launch:
        with patch_environment(**{env_name("mixed_precision"): precision}):
            return function.function(*args)  # this process: no parent to follow
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "A torch.distributed process group already exists in this process; notebook_launcher must start from "
            "a fresh process. Restart the notebook and do not create the Accelerator/PartialState before launching."
        )
    port = find_free_port() if str(use_port) == "0" else int(use_port)
    if rdzv_backend == "static" and num_nodes == 1 and is_port_in_use(port, master_addr):
        raise RuntimeError(
            f"Port {port} on {master_addr} is already in use (another job?). Pass use_port='0' to pick a free port, "
            "or another port number."
        )
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .commands.loopback_store import is_loopback, loopback_backend

    rdzv_configs = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_configs["rank"] = node_rank
        if num_nodes == 1 and node_rank == 0 and not rdzv_endpoint and is_loopback(master_addr):
            rdzv_backend = loopback_backend()  # the store listens on the loopback address only
    config = LaunchConfig(
        min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes, run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint or f"{master_addr}:{port}", rdzv_backend=rdzv_backend,
        rdzv_configs=rdzv_configs, max_restarts=max_restarts, monitor_interval=monitor_interval,
        start_method=start_method or _default_start_method(), log_line_prefix_template=log_line_prefix_template,
    )
    threads = max(1, (os.cpu_count() or 1) // num_processes)
    settings = {env_name("mixed_precision"): precision, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}
    with patch_environment(**settings):
        return elastic_launch(config=config, entrypoint=function)(*args)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> Any:
    """Run ``function(*args)`` (any callable) on ``num_processes`` CPU processes of this machine, for tests and
    debugging: always started processes, one included, so nothing it creates stays in this process."""
    with patch_environment(**{env_name("use_cpu"): "true"}):
        return notebook_launcher(function, args, num_processes=num_processes, use_port="0", _always_launch=True)
