"""Who takes part in a save: every process (the usual, collective save) or the main process alone.

diffusers' training scripts call ``save_state`` inside ``if accelerator.is_main_process:``; the reference library
then writes a complete checkpoint from that one process. hasten's save is collective (every process agrees on each
step, so a failure anywhere stops all of them), so each save first settles who takes part, through the process
group's key-value store, without a collective: every process that calls ``save_state`` counts itself in; the main
process waits until all have (normally a few milliseconds) or until ``HASTEN_SAVE_STATE_JOIN_TIMEOUT`` seconds
(default 10) have passed, and decides: **together**, or **alone**. A process arriving after an *alone* decision
writes nothing (the main process's checkpoint is complete without it) and goes on.

Saving alone needs one process to hold the whole state: a strategy whose state lives in shards on every process
(FSDP, DeepSpeed, tensor parallelism; ``Strategy.saves_from_one_process`` False) always saves together and waits for
every process, as before.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Optional

from ..collectives.process_view import ProcessView
from ..core.env_aliases import get_setting
from ..state import PartialState

__all__ = ["Participation", "settle_participation"]

logger = logging.getLogger(__name__)

_DEFAULT_JOIN_SECONDS = 10.0
_calls = itertools.count(1)  # this process's save_state calls: the same sequence on every process that saves


class Participation:
    """The outcome: ``processes`` is what the save's collectives run over (None: every process, the
    ``PartialState``; a one-process view when the main process saves alone); ``skip``: this process writes nothing."""

    def __init__(self, processes=None, skip: bool = False, alone: bool = False):
        self.processes = processes
        self.skip = skip
        self.alone = alone


def _join_seconds() -> float:
    value = get_setting("save_state_join_timeout")
    try:
        return float(value) if value not in (None, "") else _DEFAULT_JOIN_SECONDS
    except ValueError:
        raise ValueError(f"HASTEN_SAVE_STATE_JOIN_TIMEOUT={value!r} must be a number of seconds.") from None


def settle_participation(strategy) -> Participation:
    """Decide, with the other processes, who takes part in this save (see the module docstring)."""
    state = PartialState()
    if not state.use_distributed or not getattr(strategy, "saves_from_one_process", False):
        return Participation()  # one process, or state in shards on every process: together, as always
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    key = f"hasten/save_state/{next(_calls)}"
    world = state.num_processes
    store.add(f"{key}/arrived", 1)
    if state.is_main_process:
        deadline = time.monotonic() + _join_seconds()
        while store.add(f"{key}/arrived", 0) < world and time.monotonic() < deadline:
            time.sleep(0.002)
        decision = "together" if store.add(f"{key}/arrived", 0) >= world else "alone"
        store.set(f"{key}/decision", decision)
    else:
        store.wait([f"{key}/decision"], dist.default_pg_timeout if hasattr(dist, "default_pg_timeout") else
                   distributed_c10d.default_pg_timeout)
        decision = store.get(f"{key}/decision").decode()
    if decision == "together":
        return Participation()
    if state.is_main_process:
        logger.info("save_state was called on the main process only (as diffusers' scripts do): it saves alone.")
        return Participation(processes=ProcessView.alone(state), alone=True)
    logger.info("The main process saved this checkpoint alone (the other processes did not call save_state in time); "
                "process %d writes nothing.", state.process_index)
    return Participation(skip=True, alone=True)
