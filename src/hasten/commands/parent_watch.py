"""A worker that ends when the process that started it dies (Linux), so a SIGKILLed launcher leaves no orphans.

A launcher killed with SIGKILL cannot stop its workers. On Linux a process can ask the kernel for a signal
when its parent dies (``prctl(PR_SET_PDEATHSIG)``); the workers of ``hasten launch`` and ``notebook_launcher``
ask for SIGTERM. The kernel watches the parent *thread* that started the worker: both launchers start
their workers from the thread that waits for them. Other systems have no such request; there a killed
launcher's workers run on until they end or are stopped by hand.
"""
from __future__ import annotations

import os
import signal
import sys

__all__ = ["LAUNCHER_PID_ENV", "end_with_parent"]

LAUNCHER_PID_ENV = "HASTEN_LAUNCHER_PID"  # set by `hasten launch` for its workers
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(expected_parent: int | None = None) -> bool:
    """Ask for SIGTERM when the parent dies; end now if ``expected_parent`` is already gone.

    The parent may die before the request is made: then the worker already has a new parent (init or a
    subreaper) and would never be signalled, so it exits here. Returns whether the request was made.
    """
    if not sys.platform.startswith("linux"):
        return False
    if expected_parent is None:
        expected_parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # no libc, or no prctl in it
        return False
    if os.getppid() != expected_parent:
        print(f"hasten: the launcher (pid {expected_parent}) has already exited; worker {os.getpid()} ends.",
              file=sys.stderr, flush=True)
        os._exit(128 + int(signal.SIGTERM))
    return True
